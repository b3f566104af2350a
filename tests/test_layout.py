"""The import direction, read from the source with `ast` (no module is imported to check it).

events <- policy <- projections <- services <- cluster <- the command line: each package may
import only what `MAY_IMPORT` lists of ours. `events` and `policy` are pure: no clock, I/O,
randomness or NATS, so a decision depends on its inputs alone. A service imports no other
service's package (`services/runtime` is what they share) and nothing of `cluster`, the code
that sets a cluster up and runs it. The `fairlane` command line reaches the services' code only
through `cluster`; of the policy it imports only the audit and the decay settings' words, and
the simulator for its offline verbs (simulate, whatif, scenario, demo). Nothing imports the
command line but itself and the tests (a workload program in `examples/` may import
`fairlane.workload`, the standard-library module made for it). A service's code reaches the
bus (a JetStream context `.js`, a connection `.nc`) only in `services/runtime`: everything else
goes through its `Host`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent

#: The packages (or modules) of ours each package may import, itself included.
MAY_IMPORT: Final = {
    "events": {"events"},
    "policy": {"events", "policy"},
    "projections": {"events", "policy", "projections"},
    "services": {"events", "policy", "projections", "services"},
    "cluster": {"events", "policy", "projections", "services", "cluster"},
    "fairlane": {"events", "policy.audit", "policy.decay", "simulation", "cluster", "fairlane"},
}
#: The pure layers.
LAYERS: Final = ("events", "policy")
#: What a pure layer may not import, by top-level module, and why.
IMPURE: Final = {
    **dict.fromkeys(("time", "datetime", "zoneinfo"), "a clock"),
    **dict.fromkeys(
        ("os", "pathlib", "io", "socket", "asyncio", "subprocess", "shutil", "tempfile"), "I/O"
    ),
    **dict.fromkeys(("random", "uuid", "secrets"), "randomness"),
    "nats": "NATS",
}
CLI: Final = "fairlane"
#: Who may import the command line's package, and what of it.
CLI_IMPORTERS: Final = {
    "fairlane": "fairlane",
    "tests": "fairlane",
    "examples": "fairlane.workload",
}
SHARED_SERVICE: Final = "runtime"
#: The bus's handles (a JetStream context, a NATS connection): a service reaches the bus only
#: through its `Host`, so only `services/runtime` touches them.
BUS_HANDLES: Final = frozenset({"js", "nc"})
SKIPPED_DIRS: Final = {".venv", ".git", ".fairlane", "__pycache__", "node_modules"}


@dataclass(frozen=True)
class Import:
    path: Path  # relative to the root
    line: int
    module: str  # as absolute dotted name: `from fairlane import workload` is fairlane.workload

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.module}"


def python_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if not SKIPPED_DIRS.intersection(relative.parts[:-1]):
            yield relative


def module_of(path: Path) -> list[str]:
    """`services/ledger/service.py` -> [services, ledger, service]; a package is its folder."""
    parts = list(path.with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports_of(root: Path, path: Path) -> Iterator[Import]:
    tree = ast.parse((root / path).read_text(), filename=str(path))
    package = module_of(path) if path.name == "__init__.py" else module_of(path)[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            for alias in node.names:
                yield Import(
                    path, node.lineno, base if alias.name == "*" else f"{base}.{alias.name}"
                )


def opens_of(root: Path, path: Path) -> Iterator[int]:
    """Lines that call the built-in `open`."""
    tree = ast.parse((root / path).read_text(), filename=str(path))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "open"
        ):
            yield node.lineno


def bus_handles_of(root: Path, path: Path) -> Iterator[tuple[int, str]]:
    """Lines that reach an attribute `.js` or `.nc`, and which (not the module `nats.js`, where
    an exception to catch is named)."""
    tree = ast.parse((root / path).read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in BUS_HANDLES:
            if not (isinstance(node.value, ast.Name) and node.value.id == "nats"):
                yield node.lineno, node.attr


def _reaches_the_bus(where: list[str]) -> bool:
    """Whether the rule holds the module to its Host: a service's own code."""
    return where[0] == "services" and len(where) > 2 and where[1] != SHARED_SERVICE


def ours(root: Path) -> set[str]:
    """Our top-level packages: the folders at the root with an `__init__.py`."""
    return {p.parent.name for p in root.glob("*/__init__.py")}


def violations(root: Path) -> list[str]:
    packages = ours(root)
    found: list[str] = []
    for path in python_files(root):
        where = module_of(path)
        for imp in imports_of(root, path):
            found += [f"{imp}: {why}" for why in _broken_rules(where, imp.module, packages)]
        if where[0] in LAYERS:
            found += [
                f"{path}:{line} calls open(): I/O in {where[0]}/" for line in opens_of(root, path)
            ]
        if _reaches_the_bus(where):
            found += [
                f"{path}:{line} reaches .{attr}: a service reaches the bus through its Host"
                for line, attr in bus_handles_of(root, path)
            ]
    return found


def _broken_rules(where: list[str], module: str, packages: set[str]) -> Iterator[str]:
    top, target = where[0], module.split(".")
    if top in MAY_IMPORT and target[0] in packages and not _listed(MAY_IMPORT[top], module):
        yield f"{top}/ may import only {sorted(MAY_IMPORT[top])} of ours"
    if top in LAYERS and target[0] in IMPURE:
        yield f"{IMPURE[target[0]]} in {top}/, which must stay pure"
    if target[0] == CLI and not _cli_import_allowed(top, module):
        yield f"only {sorted(CLI_IMPORTERS)} may import the {CLI} command line"
    if top == "services" and len(where) > 1 and target[0] == "services" and len(target) > 1:
        if target[1] not in (where[1], SHARED_SERVICE):
            yield f"services/{where[1]} may not import another service ({target[1]})"


def _listed(allowed: set[str], module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def _cli_import_allowed(top: str, module: str) -> bool:
    allowed = CLI_IMPORTERS.get(top)
    return allowed is not None and (module == allowed or module.startswith(allowed + "."))


def test_the_source_tree_keeps_the_import_direction() -> None:
    assert violations(ROOT) == []


#: Every package of ours: its modules may not import one another in a circle, not even for
#: types alone (`if TYPE_CHECKING:`): a module that needs to name its caller names a Protocol
#: of what it needs instead (the victim search and the reclaim order of the pool's cycle, the
#: executor group of its executors). Between packages the layer table above keeps the order.
ACYCLIC: Final = (
    "events",
    "policy",
    "projections",
    "services",
    "cluster",
    "simulation",
    "fairlane",
    "bench",
)


def import_cycles(root: Path, package: str) -> list[list[str]]:
    """The circles of imports among `package`'s modules, each as the modules around it."""
    files = {".".join(module_of(p)): p for p in python_files(root) if p.parts[0] == package}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        for imp in imports_of(root, path):
            target = imp.module
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != module:
                graph[module].add(target)
    cycles: list[list[str]] = []
    state: dict[str, str] = {}  # "open" while on the path walked, then "done"

    def walk(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], module, target])
            elif target not in state:
                walk(target, [*path, module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            walk(module, [])
    return cycles


def test_no_module_imports_in_a_circle() -> None:
    for package in ACYCLIC:
        assert import_cycles(ROOT, package) == []


def test_an_import_circle_is_found_even_for_types_alone(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "services/__init__.py": "",
            "services/a.py": "from services.b import B\n",
            "services/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from services.a import A\n",
        },
    )
    assert import_cycles(tmp_path, "services") == [["services.a", "services.b", "services.a"]]


def test_the_packages_it_checks_are_the_real_ones() -> None:
    """A check over no files would pass: make sure the layers and services are there."""
    assert {*MAY_IMPORT, "simulation"} <= ours(ROOT)
    files = {module_of(p)[0] for p in python_files(ROOT)}
    assert {*MAY_IMPORT, "tests"} <= files


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_each_rule_reports_the_file_line_and_module(tmp_path: Path) -> None:
    packages: tuple[str, ...] = ("events", "policy", "services", "services/ledger")
    packages += ("services/admission", "services/runtime", "services/executor", "simulation")
    packages += ("cluster", "fairlane", "tests")
    _write(tmp_path, {f"{p}/__init__.py": "" for p in packages})
    _write(
        tmp_path,
        {
            "events/model.py": "from policy import state\n",
            "policy/fold.py": "import events\nimport time\nfrom datetime import datetime\n",
            "policy/io.py": "def read():\n    return open('x')\n",
            "policy/rand.py": "from uuid import uuid4\nimport nats.js\n",
            "services/ledger/service.py": (
                "from services.runtime import log\nfrom services.admission import rules\n"
                "from . import helpers\nfrom ..admission import service\n"
                "host.log.js.publish()\nexcept_ = nats.js.errors.Error\n"
            ),
            "services/executor/executor.py": "log.nc.drain()\n",
            "services/runtime/host.py": "from cluster.servers import NatsServer\n",
            "cluster/embedded.py": "from services.runtime import auth\nimport simulation\n",
            "fairlane/cli.py": (
                "from cluster import embedded\nfrom policy.audit import audit\n"
                "from policy.state import ClusterState\nfrom services.runtime import auth\n"
            ),
            "simulation/engine.py": "from fairlane.cli import app\n",
            "examples/train.py": "from fairlane import workload\nfrom fairlane import cli\n",
            "tests/test_x.py": "from fairlane.cli import app\nimport time\n",
        },
    )
    services = "['events', 'policy', 'projections', 'services']"
    platform = "['cluster', 'events', 'policy', 'projections', 'services']"
    cli = "['cluster', 'events', 'fairlane', 'policy.audit', 'policy.decay', 'simulation']"
    assert violations(tmp_path) == [
        f"cluster/embedded.py:2 imports simulation: cluster/ may import only {platform} of ours",
        "events/model.py:1 imports policy.state: events/ may import only ['events'] of ours",
        "examples/train.py:2 imports fairlane.cli: only ['examples', 'fairlane', 'tests'] "
        "may import the fairlane command line",
        f"fairlane/cli.py:3 imports policy.state.ClusterState: fairlane/ may import only {cli} "
        "of ours",
        f"fairlane/cli.py:4 imports services.runtime.auth: fairlane/ may import only {cli} of ours",
        "policy/fold.py:2 imports time: a clock in policy/, which must stay pure",
        "policy/fold.py:3 imports datetime.datetime: a clock in policy/, which must stay pure",
        "policy/io.py:2 calls open(): I/O in policy/",
        "policy/rand.py:1 imports uuid.uuid4: randomness in policy/, which must stay pure",
        "policy/rand.py:2 imports nats.js: NATS in policy/, which must stay pure",
        "services/executor/executor.py:1 reaches .nc: a service reaches the bus through its Host",
        "services/ledger/service.py:2 imports services.admission.rules: "
        "services/ledger may not import another service (admission)",
        "services/ledger/service.py:4 imports services.admission.service: "
        "services/ledger may not import another service (admission)",
        "services/ledger/service.py:5 reaches .js: a service reaches the bus through its Host",
        f"services/runtime/host.py:1 imports cluster.servers.NatsServer: services/ may import "
        f"only {services} of ours",
        "simulation/engine.py:1 imports fairlane.cli.app: only ['examples', 'fairlane', 'tests'] "
        "may import the fairlane command line",
    ]
