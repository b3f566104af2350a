"""Rule 5's reach: per node, the most GPUs a reclaim could ever free there.

A claimant's walk takes each giving project's victims in that project's own order while the
project may give (`reclaim_order.Offers`: its victims listed while it holds more than its
floor), so whatever the walk takes is part of those lists' entries above their floors. Per
node, this keeps the idle and releasing GPUs plus every GPU those entries free, for both
floors (the claimant within its quota or not), and how many nodes reach each size: whether a
claimant could fit if every project gave all it may is then a sum over sizes, and a claimant
the lists cannot make room for is turned away without a walk.

It is an exact bound, or a safe over-estimate: GPUs are counted once per entry that frees
them, where the walk counts each GPU once (victims hold different GPUs, so the two agree), and
the claimant's own project's entries count too, though it never gives to itself: they are
none, as a claimant's project holds less than its floor (it must end within its fair share,
and within its quota to claim below the lower floor).
The lists report every change to their entries (`shift`), and the cycle every node whose idle
or releasing GPUs changed (`touch`), so it is never worked out again.
"""

from __future__ import annotations

from typing import Protocol

from policy.candidates import Candidate
from policy.capacity import Capacity


class ReachCycle(Protocol):
    """What the reach reads of the pool's cycle (`pool_cycle.PoolCycle`, which holds it)."""

    @property
    def capacity(self) -> Capacity: ...

    @property
    def releasing(self) -> dict[str, list[int]]: ...


#: Per node: GPUs, for one floor (index 0: the claimant above its quota; 1: within it)
PerNode = dict[str, int]


class Reach:
    """Per node of the pool and per floor: idle and releasing GPUs plus what the listed
    victims above their projects' floors free (`total`; a node missing holds none), and the
    nodes counted by that total, at most the node's GPUs (`sizes`, and `nodes` by size)."""

    __slots__ = ("_cycle", "_room", "kept", "nodes", "sizes", "total")

    def __init__(self, cycle: ReachCycle) -> None:
        self._cycle = cycle
        #: the floors whose victims are counted (`reclaim_order.reach_of`): without, a
        #: floor's totals are the idle and releasing GPUs only
        self.kept: tuple[int, ...] = ()
        releasing = cycle.releasing
        capacity = cycle.capacity
        # only nodes with room or victims are kept: a full node without either adds nothing
        self._room: PerNode = {}
        for node in capacity.nodes:
            room = len(node.free) + len(releasing.get(node.name, ()))
            if room:
                self._room[node.name] = room
        self.total: tuple[PerNode, PerNode] = (dict(self._room), dict(self._room))
        self.sizes: tuple[list[int], list[int]] = (
            [0] * (capacity.max_gpus + 1),
            [0] * (capacity.max_gpus + 1),
        )
        #: per floor and size above 0: the nodes of that size
        self.nodes: tuple[list[set[str]], list[set[str]]] = (
            [set() for _ in range(capacity.max_gpus + 1)],
            [set() for _ in range(capacity.max_gpus + 1)],
        )
        by_name = capacity.by_name
        for name, room in self._room.items():
            size = min(room, by_name[name].gpus)
            for f in (0, 1):
                self.sizes[f][size] += 1
                self.nodes[f][size].add(name)

    def shift(self, floor: int, node: str, gpus: int) -> None:
        """Listed victims above the floor free `gpus` more GPUs on `node` (fewer if < 0)."""
        slot = self._cycle.capacity.by_name.get(node)
        if slot is None:
            return  # a node of no pool's capacity here: it holds no replica of the claimant
        total = self.total[floor]
        before = total.get(node, 0)
        if before + gpus:
            total[node] = before + gpus
        else:
            del total[node]
        old, new = min(before, slot.gpus), min(before + gpus, slot.gpus)
        if old != new:  # sizes of 0 are not counted: they hold no replica
            sizes, nodes = self.sizes[floor], self.nodes[floor]
            if old:
                sizes[old] -= 1
                nodes[old].discard(node)
            if new:
                sizes[new] += 1
                nodes[new].add(node)

    def touch(self, nodes: set[str]) -> None:
        """These nodes' idle or releasing GPUs may have changed."""
        by_name, releasing = self._cycle.capacity.by_name, self._cycle.releasing
        for node in nodes:
            slot = by_name.get(node)
            if slot is None:
                continue
            room = len(slot.free) + len(releasing.get(node, ()))
            change = room - self._room.get(node, 0)
            if change:
                if room:
                    self._room[node] = room
                else:
                    del self._room[node]
                self.shift(0, node, change)
                self.shift(1, node, change)

    def could_fit(self, cand: Candidate, floor: int) -> bool:
        """Could the claimant fit (on no node in particular) if every project gave all its
        listed victims above the floor?"""
        gpus, replicas = cand.job.gpus, cand.replicas
        capacity = self._cycle.capacity
        if gpus <= 0:
            return bool(capacity.nodes)
        total = self.total[floor]
        if cand.ports:  # the slow path, as `Capacity.fits` takes it
            extra = {node.name: total.get(node.name, 0) - len(node.free) for node in capacity.nodes}
            return len(capacity.port_nodes(gpus, cand.ports, None, extra)) >= replicas
        sizes = self.sizes[floor]
        return sum(sizes[size] * (size // gpus) for size in range(gpus, len(sizes))) >= replicas

    def few(self, floor: int, gpus: int) -> bool:
        """Could victims make room for a replica of `gpus` GPUs on few nodes (an eighth of
        them at most)? A walk that passes over the entries of jobs on no such node passes
        over little otherwise, and looking costs more than it saves."""
        return gpus > 1 and 8 * sum(self.sizes[floor][gpus:]) <= len(self._cycle.capacity.nodes)

    def hopeful(self, floor: int, gpus: int) -> set[str]:
        """The nodes where victims could make room for a replica of `gpus` GPUs."""
        return set().union(*self.nodes[floor][gpus:])
