"""The simulated cluster: `--nodes N --gpus-per-node G`, or a YAML file in the scenario format.

A cluster file has the `config`, `pools` and `projects` sections of a scenario file
(scenarios/FORMAT.md) and no steps; it is read by the scenario parser itself, so the two formats
cannot drift apart. Trace jobs run in the default compute pool. The scheduler type and victim
order come from --policy and --victim-order, so a file may set only `fitting` under
`config.scheduler`, and pools may not carry scheduler settings of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from events import ProjectTerms
from events.model import Fitting
from simulation.spec import (
    NodeEntry,
    PoolEntry,
    ProjectEntry,
    ScenarioError,
    compute_pool_of,
    parse_scenario,
    project_terms,
)
from simulation.trace.errors import SimulationError

DEFAULT_POOL = "default"


@dataclass(frozen=True)
class ClusterSpec:
    pools: tuple[PoolEntry, ...]
    compute_pool: str
    fitting: Fitting = "best"
    #: Projects the file configures; they replace the quotas computed from the trace.
    projects: tuple[ProjectEntry, ...] = ()

    @property
    def nodes(self) -> list[NodeEntry]:
        return [n for p in self.pools if p.name == self.compute_pool for n in p.nodes]

    @property
    def gpus(self) -> int:
        """GPUs of the compute pool: what trace jobs can use."""
        return sum(n.gpus for n in self.nodes)

    @property
    def largest_node(self) -> int:
        return max((n.gpus for n in self.nodes), default=0)

    def terms(self, entry: ProjectEntry) -> dict[str, ProjectTerms]:
        return project_terms(entry, [p.name for p in self.pools], self.compute_pool)


def uniform_cluster(nodes: int, gpus_per_node: int) -> ClusterSpec:
    if nodes < 1:
        raise SimulationError(f"--nodes must be 1 or more, got {nodes}")
    if gpus_per_node < 1:
        raise SimulationError(f"--gpus-per-node must be 1 or more, got {gpus_per_node}")
    width = len(str(nodes - 1))
    entries = tuple(NodeEntry(f"n{i:0{width}d}", gpus_per_node, DEFAULT_POOL) for i in range(nodes))
    return ClusterSpec(pools=(PoolEntry(DEFAULT_POOL, None, entries),), compute_pool=DEFAULT_POOL)


def load_cluster(path: Path) -> ClusterSpec:
    try:
        data = YAML(typ="safe", pure=True).load(path.read_text())
    except OSError as e:
        raise SimulationError(f"--cluster {path}: cannot read it ({e.strerror})") from None
    except YAMLError as e:
        raise SimulationError(f"--cluster {path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SimulationError(f"--cluster {path}: expected a mapping with config, pools, projects")
    if "steps" in data:
        raise SimulationError(f"--cluster {path}: a cluster file has no steps")
    try:
        scenario = parse_scenario({"name": path.stem, **data, "steps": []}, path)
    except ScenarioError as e:
        raise SimulationError(str(e)) from None
    settings = scenario.config.scheduler
    if (settings.type, settings.victim_order) != ("fair_share", "newest"):
        raise SimulationError(
            f"{path}: config.scheduler may set only fitting; "
            "the scheduler comes from --policy and the victim order from --victim-order"
        )
    for pool in scenario.pools:
        if pool.scheduler is not None:
            raise SimulationError(
                f"{path}: pool {pool.name!r} has scheduler settings; --policy sets the scheduler"
            )
    compute = compute_pool_of(scenario)
    spec = ClusterSpec(scenario.pools, compute, settings.fitting, scenario.projects)
    if spec.gpus == 0:
        raise SimulationError(f"{path}: the compute pool {compute!r} has no GPUs")
    return spec
