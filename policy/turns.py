"""Turn order: which project goes next, and which of its jobs.

Rule 2 ranks projects (`project_key`) and each project's jobs (`job_key`); `Turns` gives the
candidates in that order, ranking a project again after each of its jobs is served. Round robin
ranks projects by what they hold (`fewest_held_key`); the priority scheduler has one queue for
the pool (`queue_key`).
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Iterator
from typing import Protocol

from policy.accounts import Account, Accounts
from policy.candidates import Candidate, JobKey

ProjectKey = tuple[bool, bool, int, float, float, int]


def project_key(acct: Account, cand: Candidate) -> ProjectKey:
    """Rule 2: not over fair share first, then within quota (with this job), then higher project
    priority, then the lower share of the fair share in use, then the older project."""
    return key_for_gpus(acct, cand.gpus)


def key_for_gpus(acct: Account, gpus: int) -> ProjectKey:
    """`project_key` with a job of this many GPUs: all it reads of the job."""
    return (
        acct.usage > acct.fair_share,
        acct.usage + gpus > acct.quota,
        -acct.priority,
        acct.share_in_use(gpus),
        acct.share_in_use(),
        acct.order,
    )


def job_key(cand: Candidate) -> JobKey:
    """Inside a project (rules 2 and 6): higher job priority first; among equal priority, jobs
    below their minimum, then extra replicas in rounds (every job's first extra, then every
    job's second, ...: round robin), then submission order."""
    if cand.extra:
        return (-cand.priority, 1, cand.before - cand.job.min_replicas, cand.seq)
    return (-cand.priority, 0, 0, cand.seq)


def ranked(cand: Candidate) -> JobKey:
    """job_key(cand), worked out once per candidate and kept in it: a queue's front is
    compared with the candidates queued later (`_Queue`) each time its project is ranked.
    Only fronts are keyed: the queues are put in order without keys (`in_job_order`)."""
    key = cand.ranked
    if key is None:
        key = cand.ranked = job_key(cand)
    return key


#: The part of a job key before the submission order: (-priority, 0, 0) for a job's minimum,
#: (-priority, 1, round) for an extra replica
Rank = tuple[int, int, int]
#: A rank as a pass over the candidates buckets them: the priority for a job's minimum,
#: (priority, round) for an extra replica (no tuple made for most candidates)
_Bucket = int | tuple[int, int]


def in_job_order(cands: list[Candidate]) -> list[Candidate]:
    """One project's candidates sorted by `job_key`, stably (`grouped_in_job_order`)."""
    return next(iter(grouped_in_job_order(cands).values()), [])


def grouped_in_job_order(cands: list[Candidate]) -> dict[str, list[Candidate]]:
    """Each project's candidates sorted by `job_key`, stably, in one pass over them: put in
    buckets by project and by the key's part before the submission order, the buckets in
    order, each in submission order. The candidates mostly come in submission order already
    (the fold keeps jobs so, and the candidate search), which the pass checks on the way:
    then no bucket needs sorting.

    Sorting by the whole key made a tuple for every candidate, compared field by field.
    Grouping, bucketing and sorting in three passes then read each candidate three times: at
    4x the bench's size 40,000 of them, no longer in the processor's second-level cache, and
    the three passes took 6.4 times as long as at 1x."""
    by_project: dict[str, dict[_Bucket, list[Candidate]]] = {}
    in_order, last = True, -1
    for cand in cands:
        seq = cand.seq
        if seq < last:
            in_order = False
        last = seq
        buckets = by_project.get(cand.project)
        if buckets is None:
            buckets = by_project[cand.project] = {}
        key: _Bucket = (
            (cand.priority, cand.before - cand.job.min_replicas) if cand.extra else cand.priority
        )
        bucket = buckets.get(key)
        if bucket is None:
            buckets[key] = [cand]
        else:
            bucket.append(cand)
    return {project: _in_order(buckets, in_order) for project, buckets in by_project.items()}


def _in_order(buckets: dict[_Bucket, list[Candidate]], by_seq: bool) -> list[Candidate]:
    """The buckets' candidates in job order (each bucket sorted by submission order unless
    `by_seq` says it is)."""
    if not by_seq:
        for bucket in buckets.values():
            bucket.sort(key=_seq)  # stable: equal keys keep the order given
    if len(buckets) == 1:
        (bucket,) = buckets.values()
        return bucket
    ranks = sorted((_rank(key), bucket) for key, bucket in buckets.items())
    return [cand for _, bucket in ranks for cand in bucket]


def _rank(key: _Bucket) -> Rank:
    if isinstance(key, int):
        return (-key, 0, 0)
    return (-key[0], 1, key[1])


_seq = operator.attrgetter("seq")


#: A candidate queued after the start: job_key(cand) flattened, the order queued, the candidate
LaterItem = tuple[int, int, int, int, int, Candidate]


class _Queue:
    """One project's candidates in job order (job_key, then the order queued): a list sorted
    once, plus a heap for candidates queued later (an elastic job's next replica), which come
    after every listed candidate of the same job_key."""

    __slots__ = ("acct", "at", "items", "key", "key_gpus", "key_usage", "later")

    def __init__(self, acct: Account, items: list[Candidate]) -> None:
        self.acct = acct
        self.items = items
        self.at = 0
        self.later: list[LaterItem] = []
        # the project's key, remembered with the usage and request size it was computed for
        self.key: ProjectKey | None = None
        self.key_usage = 0
        self.key_gpus = 0

    def _later_first(self) -> bool:
        """Does the first candidate queued later go before the next listed one?"""
        return self.later[0][:4] < ranked(self.items[self.at])

    def front(self) -> Candidate | None:
        if self.at < len(self.items):
            if self.later and self._later_first():
                return self.later[0][5]
            return self.items[self.at]
        return self.later[0][5] if self.later else None

    def take(self) -> Candidate | None:
        if self.at < len(self.items) and not (self.later and self._later_first()):
            self.at += 1
            return self.items[self.at - 1]
        return heapq.heappop(self.later)[5] if self.later else None

    def rank(self, front: Candidate) -> ProjectKey:
        """project_key(acct, front), which changes only with the usage and the request size."""
        gpus, usage = front.gpus, self.acct.usage
        if self.key is None or usage != self.key_usage or gpus != self.key_gpus:
            self.key = project_key(self.acct, front)
            self.key_usage, self.key_gpus = usage, gpus
        return self.key

    def pass_idle(
        self, able: set[Candidate], project: str, beat: tuple[ProjectKey, str] | None
    ) -> None:
        """Move past the idle candidates (not `able`) from the front on that the project
        would take one after another now (each a turn in which nothing happens): up to the
        first able one, or the first whose key does not `beat` (the next project's entry in
        the turns' heap; None if there is none), which is left at the front.

        Nothing changes while they take their turns, so the project's key with each depends
        only on its request size, worked out once per size."""
        items, at = self.items, self.at
        stops: dict[int, bool] = {}  # per request size: would the project stop there?
        while at < len(items):
            cand = items[at]
            if cand in able:
                break
            if beat is not None:
                gpus = cand.gpus
                stop = stops.get(gpus)
                if stop is None:
                    stop = stops[gpus] = not (key_for_gpus(self.acct, gpus), project) < beat
                if stop:
                    break
            at += 1
        self.at = at


class Sleepers(Protocol):
    """Candidates that can do nothing at their turn while their project is `asleep`, all but
    the `able`: the turns pass over them without giving them (the fair-share preemption
    pass's). A candidate that is not able is idle."""

    able: set[Candidate]

    def asleep(self, project: str) -> bool: ...


class Turns:
    """Projects taking turns, each with its own queue of candidates.

    A heap holds one entry per project with candidates left, keyed by `project_key` as it was
    when the project was last served (other projects are not ranked again when one is served).
    A project whose new key is still the smallest goes again without a trip through the heap.

    With `sleepers`, the idle candidates of a project that is asleep take their turns without
    being given (nothing would happen in them), a run of them at once (`_Queue.pass_idle`):
    a preemption pass gives every waiting candidate its turn, and most of 40,000 at 4x the
    bench's size could do nothing in it.
    """

    def __init__(
        self, accounts: Accounts, cands: list[Candidate], sleepers: Sleepers | None = None
    ) -> None:
        self._tie = len(cands)  # candidates queued later go after those of the same job_key
        self.queues: dict[str, _Queue] = {
            project: _Queue(accounts.account(project), items)
            for project, items in grouped_in_job_order(cands).items()
        }
        self.sleepers = sleepers
        self.heap: list[tuple[ProjectKey, str]] = []
        for project, q in self.queues.items():
            front = q.front()
            if front is not None:
                self.heap.append((q.rank(front), project))
        heapq.heapify(self.heap)

    def __iter__(self) -> Iterator[Candidate]:
        """The candidates in turn order. The loop body handles each one (and may `queue` what
        follows it) before its project is ranked again."""
        heap, queues, sleepers = self.heap, self.queues, self.sleepers
        while heap:
            _, project = heapq.heappop(heap)
            q = queues[project]
            while (cand := q.take()) is not None:
                if (
                    sleepers is not None
                    and cand not in sleepers.able
                    and not q.later
                    and sleepers.asleep(project)
                ):
                    q.pass_idle(sleepers.able, project, heap[0] if heap else None)
                else:
                    yield cand
                front = q.front()
                if front is None:
                    break
                entry = (q.rank(front), project)
                if heap and not entry < heap[0]:
                    heapq.heappush(heap, entry)
                    break
                # else its new key is still the smallest: it would be popped straight back

    def queue(self, cand: Candidate) -> None:
        """Queue a candidate in its project (an elastic job's next replica)."""
        self._tie += 1
        item = (*job_key(cand), self._tie, cand)
        heapq.heappush(self.queues[cand.project].later, item)


def fewest_held_key(acct: Account) -> tuple[int, int]:
    """Round robin: the project holding the fewest GPUs first, then the older project."""
    return (acct.usage, acct.order)


def queue_key(cand: Candidate) -> tuple[int, int, int]:
    """The priority scheduler's one queue: higher job priority first, a job's minimum before
    extra replicas, then submission order."""
    return (-cand.priority, 1 if cand.extra else 0, cand.seq)
