"""What a pool could hold when empty: the rule admission and the cycle both apply."""

from __future__ import annotations

from policy.state import ClusterState, Node


def nodes_for(state: ClusterState, pool: str, node: str | None) -> list[Node]:
    """The pool's nodes, or only `node` if the job is pinned to it."""
    nodes = [n for n in state.nodes.values() if n.pool == pool]
    if node is not None:
        nodes = [n for n in nodes if n.name == node]
    return nodes


def could_hold(state: ClusterState, pool: str, gpus: int, replicas: int, node: str | None) -> bool:
    """Could the pool (or the pinned node in it) hold `replicas` of `gpus` if it were empty?"""
    nodes = nodes_for(state, pool, node)
    if not nodes:
        return False
    if gpus <= 0:
        return True
    return sum(n.gpus // gpus for n in nodes) >= replicas
