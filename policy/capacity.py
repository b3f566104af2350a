"""Free GPUs of one pool during a cycle, and placing replicas on them.

Nodes are bucketed by their number of free GPUs, so a fit is found without scanning the pool:
`best` takes the fullest node that still fits (packing), `worst` the emptiest (spreading), and
ties go to the node that registered first, so placement is deterministic. Replicas of one job are
all the same size, so a gang of r replicas of g GPUs fits exactly when the pool has r slots of g
GPUs, summed over nodes; that sum is what `fits` computes.

Host ports are the other thing a node has once: a replica that publishes ports (`ports`, the
job's host ports) fits a node only where none of them is taken, by a job holding replicas
there or one GPUs are held for there, and a job's replicas that publish ports go one to a node.
Those requests take a slower path that looks at every node; a job without ports never does.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from events import Replica
from events.model import Fitting

#: GPUs that victims are about to give up, per node: what a preemption would free.
Overlay = Mapping[str, Sequence[int]]
#: Host ports taken per node (by jobs holding replicas there, or held for there).
TakenPorts = Mapping[str, set[int]]


@dataclass(slots=True)
class NodeSlots:
    name: str
    order: int
    index: int
    gpus: int
    free: list[int] = field(default_factory=list)  # sorted indexes of idle GPUs


_NO_PORTS: frozenset[int] = frozenset()


class Capacity:
    """The idle GPUs of one pool, updated as the cycle hands them out."""

    def __init__(self, nodes: list[NodeSlots], ports: TakenPorts | None = None) -> None:
        self.nodes = nodes
        self.by_name = {n.name: n for n in nodes}
        #: host ports taken per node; those placed in the cycle are added
        self.ports: dict[str, set[int]] = {k: set(v) for k, v in ports.items()} if ports else {}
        self.max_gpus = max((n.gpus for n in nodes), default=0)
        self.count = [0] * (self.max_gpus + 1)  # nodes by number of free GPUs
        self._buckets: list[list[tuple[int, int]]] = [[] for _ in range(self.max_gpus + 1)]
        self.total_free = 0
        for node in nodes:
            f = len(node.free)
            self.count[f] += 1
            self._buckets[f].append((node.order, node.index))
            self.total_free += f
        for bucket in self._buckets:
            heapq.heapify(bucket)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def free_on(self, node: str) -> int:
        slot = self.by_name.get(node)
        return len(slot.free) if slot is not None else 0

    # -- can it fit? ---------------------------------------------------------------------------

    def slots(self, gpus: int) -> int:
        """How many replicas of `gpus` GPUs the idle GPUs could hold."""
        if gpus <= 0:
            return 1 << 30 if self.nodes else 0
        return sum(self.count[f] * (f // gpus) for f in range(gpus, self.max_gpus + 1))

    def fits(  # noqa: PLR0911 (host ports' own path, then the GPU-only cases)
        self,
        gpus: int,
        replicas: int,
        pin: str | None = None,
        ports: tuple[int, ...] = (),
        overlay: Overlay | None = None,
    ) -> bool:
        if ports:
            freed = {k: len(v) for k, v in overlay.items()} if overlay else {}
            return len(self.port_nodes(gpus, ports, pin, freed)) >= replicas
        if pin is not None:
            slot = self.by_name.get(pin)
            if slot is None:
                return False
            if gpus <= 0:
                return True
            avail = len(slot.free) + len(overlay.get(pin, ())) if overlay else len(slot.free)
            return avail // gpus >= replicas
        if gpus <= 0:
            return bool(self.nodes)
        if replicas * gpus > self.total_free + (sum(map(len, overlay.values())) if overlay else 0):
            return False
        total = self.slots(gpus)
        if overlay:
            for name, extra in overlay.items():
                slot = self.by_name.get(name)
                if slot is None:
                    continue
                base = len(slot.free)
                total += (base + len(extra)) // gpus - base // gpus
        return total >= replicas

    def port_nodes(
        self, gpus: int, ports: tuple[int, ...], pin: str | None, extra: Mapping[str, int]
    ) -> list[NodeSlots]:
        """The nodes that could take one replica publishing `ports` (with `extra` GPUs freed
        per node): none of its ports taken there, and room for its GPUs."""
        if pin is not None:
            slot = self.by_name.get(pin)
            nodes = [slot] if slot is not None else []
        else:
            nodes = self.nodes
        return [
            node
            for node in nodes
            if self.ports.get(node.name, _NO_PORTS).isdisjoint(ports)
            and len(node.free) + extra.get(node.name, 0) >= gpus
        ]

    # -- placing -------------------------------------------------------------------------------

    def place(  # noqa: PLR0913 (a request, its fitting and the GPUs victims free)
        self,
        gpus: int,
        replicas: int,
        fitting: Fitting,
        pin: str | None = None,
        ports: tuple[int, ...] = (),
        overlay: Overlay | None = None,
    ) -> list[Replica] | None:
        """Take GPUs for `replicas` replicas, or take nothing and return None."""
        if not self.fits(gpus, replicas, pin, ports, overlay):
            return None
        extra = {k: list(v) for k, v in overlay.items()} if overlay else {}
        if ports:
            return self._place_with_ports(gpus, replicas, fitting, pin, ports, extra)
        placed: list[Replica] = []
        for _ in range(replicas):
            node = self._choose(gpus, fitting, pin, extra)
            assert node is not None, "fits() promised room"
            placed.append(self._take(node, gpus, extra))
        return placed

    def _place_with_ports(  # noqa: PLR0913 (place's request, its ports known)
        self,
        gpus: int,
        replicas: int,
        fitting: Fitting,
        pin: str | None,
        ports: tuple[int, ...],
        extra: dict[str, list[int]],
    ) -> list[Replica]:
        """One replica to a node, on the nodes where its ports are free, in fitting order
        (the same order as without ports: by GPUs available, then registration)."""
        counts = {k: len(v) for k, v in extra.items()}
        nodes = self.port_nodes(gpus, ports, pin, counts)
        nodes.sort(key=lambda n: self._fit_key(len(n.free) + counts.get(n.name, 0), n, fitting))
        placed: list[Replica] = []
        for node in nodes[:replicas]:
            placed.append(self._take(node, gpus, extra))
            self.ports.setdefault(node.name, set()).update(ports)
        return placed

    def _choose(
        self, gpus: int, fitting: Fitting, pin: str | None, extra: dict[str, list[int]]
    ) -> NodeSlots | None:
        if pin is not None:
            return self.by_name.get(pin)
        if extra:
            return self._choose_with_overlay(gpus, fitting, extra)
        want = (
            range(gpus, self.max_gpus + 1)
            if fitting == "best"
            else range(self.max_gpus, gpus - 1, -1)
        )
        for f in want:
            bucket = self._buckets[f]
            while bucket and len(self.nodes[bucket[0][1]].free) != f:
                heapq.heappop(bucket)  # stale: that node's count changed since it was filed here
            if bucket:
                return self.nodes[bucket[0][1]]
        return None

    def _choose_with_overlay(
        self, gpus: int, fitting: Fitting, extra: dict[str, list[int]]
    ) -> NodeSlots | None:
        """The best node when victims' GPUs count too: the best of the overlay's nodes against
        the buckets' choice, which is exact unless the buckets pick an overlay node."""
        outside = self._choose(gpus, fitting, None, {})
        if outside is not None and outside.name in extra:
            return self._choose_by_scan(gpus, fitting, extra)
        chosen = outside
        best = None if outside is None else self._fit_key(len(outside.free), outside, fitting)
        for name, freed in extra.items():
            node = self.by_name.get(name)
            if node is None or len(node.free) + len(freed) < gpus:
                continue
            key = self._fit_key(len(node.free) + len(freed), node, fitting)
            if best is None or key < best:
                best, chosen = key, node
        return chosen

    @staticmethod
    def _fit_key(avail: int, node: NodeSlots, fitting: Fitting) -> tuple[int, int]:
        return (avail if fitting == "best" else -avail, node.order)

    def _choose_by_scan(
        self, gpus: int, fitting: Fitting, extra: dict[str, list[int]]
    ) -> NodeSlots | None:
        best: tuple[int, int] | None = None
        chosen: NodeSlots | None = None
        for node in self.nodes:
            avail = len(node.free) + len(extra.get(node.name, ()))
            if avail < gpus:
                continue
            key = self._fit_key(avail, node, fitting)
            if best is None or key < best:
                best, chosen = key, node
        return chosen

    def _take(self, node: NodeSlots, gpus: int, extra: dict[str, list[int]]) -> Replica:
        freed = extra.get(node.name, [])
        from_extra = freed[:gpus]
        del freed[: len(from_extra)]
        from_free = node.free[: gpus - len(from_extra)]
        if from_free:
            self._set_free(node, node.free[len(from_free) :])
        return Replica(node.name, tuple(sorted(from_extra + from_free)))

    def reserve(self, replicas: Sequence[Replica]) -> None:
        """Mark GPUs as taken (by a nomination made earlier, or a replica placed elsewhere)."""
        for r in replicas:
            node = self.by_name.get(r.node)
            if node is not None:
                taken = set(r.gpus)
                self._set_free(node, [g for g in node.free if g not in taken])

    def all_free(self, replicas: Sequence[Replica]) -> bool:
        for r in replicas:
            node = self.by_name.get(r.node)
            if node is None or not set(r.gpus) <= set(node.free):
                return False
        return True

    def _set_free(self, node: NodeSlots, free: list[int]) -> None:
        before, after = len(node.free), len(free)
        node.free = free
        if before != after:
            self.count[before] -= 1
            self.count[after] += 1
            self.total_free += after - before
            heapq.heappush(self._buckets[after], (node.order, node.index))


class OverlayFit:
    """`Capacity.fits` for one request while the overlay grows or shrinks a node at a time.

    Looking for victims changes the overlay one victim at a time and asks again after each:
    `Capacity.fits` walks the whole overlay every time, which made taking (and sparing) k
    victims cost k^2 (k reaches hundreds of small victims at 4x the bench's size). Here each
    node's change adjusts running totals, so asking costs nothing. The idle GPUs must not change
    meanwhile (no placing while victims are looked for). Same answers as `Capacity.fits`.
    """

    def __init__(  # noqa: PLR0913 (the request, as `Capacity.fits` takes it)
        self,
        capacity: Capacity,
        gpus: int,
        replicas: int,
        pin: str | None,
        overlay: Overlay,
        ports: tuple[int, ...] = (),
    ) -> None:
        self.capacity = capacity
        self.gpus = gpus
        self.replicas = replicas
        self.pin = pin
        self.ports = ports
        self._sizes: dict[str, int] = {}  # GPUs in the overlay, per node
        self._overlay_gpus = 0  # all of them (nodes of other pools too, as fits counts them)
        self._idle_slots = capacity.slots(gpus) if gpus > 0 and pin is None else 0
        self._extra_slots = 0  # replicas the overlay adds to what the idle GPUs hold
        for node, freed in overlay.items():
            self.resize(node, len(freed))

    def resize(self, node: str, size: int) -> None:
        """The overlay now holds `size` GPUs on `node`."""
        old = self._sizes.get(node, 0)
        if size == old:
            return
        self._sizes[node] = size
        self._overlay_gpus += size - old
        slot = self.capacity.by_name.get(node)
        if slot is not None and self.gpus > 0:
            idle = len(slot.free)
            self._extra_slots += (idle + size) // self.gpus - (idle + old) // self.gpus

    def fits(self) -> bool:  # noqa: PLR0911 (as `Capacity.fits`)
        capacity, gpus = self.capacity, self.gpus
        if self.ports:  # the slow path, as in `Capacity.fits`
            return len(capacity.port_nodes(gpus, self.ports, self.pin, self._sizes)) >= (
                self.replicas
            )
        if self.pin is not None:
            slot = capacity.by_name.get(self.pin)
            if slot is None:
                return False
            if gpus <= 0:
                return True
            return (len(slot.free) + self._sizes.get(self.pin, 0)) // gpus >= self.replicas
        if gpus <= 0:
            return bool(capacity.nodes)
        if self.replicas * gpus > capacity.total_free + self._overlay_gpus:
            return False
        return self._idle_slots + self._extra_slots >= self.replicas
