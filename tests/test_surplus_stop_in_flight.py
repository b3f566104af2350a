"""Rule 5 across cycles: a job that gave up some replicas is still a victim candidate for what
it holds, also in a later cycle that runs while the executor has not yet answered the stop.

On the core engine an executor answers at once, so no cycle sees a stop of some replicas in
flight; the live services can (a real workload takes a moment to exit), and there the policy
passed over the job and stopped a whole job instead, until `may_be_victim` kept such a job a
candidate for the replicas it keeps.
"""

from __future__ import annotations

from pathlib import Path

from events import JobNominated, JobPreemptionRequested, JobSpec
from policy.cycle import decide
from simulation.scenario.core_engine import CoreEngine
from simulation.spec import parse_scenario

CLUSTER = parse_scenario(
    {
        "name": "surplus-stop-in-flight",
        "pools": [{"name": "default", "nodes": [{"name": "n0", "gpus": 4}]}],
        "projects": [
            {"name": "a", "quota": 0},
            {"name": "b", "quota": 1},
            {"name": "c", "quota": 1},
        ],
        "steps": [
            {
                "submit": [
                    {"id": "w", "project": "a"},
                    {"id": "e", "project": "a", "replicas": 3, "min_replicas": 1},
                ]
            }
        ],
    },
    Path("surplus-stop-in-flight.yaml"),
)


def test_a_job_whose_surplus_stop_is_in_flight_is_still_a_victim_candidate() -> None:
    core = CoreEngine(CLUSTER)
    core.step(CLUSTER.steps[0])
    vc = core.vc
    vc.submit("b1", JobSpec(project="b", gpus=1))
    for event in decide(vc.state, vc.now).events:  # decided and recorded, not yet answered
        vc.record(event)
    e = vc.state.jobs["e"]
    assert (len(e.held), e.stop_replicas, e.phase) == (3, 1, "running")
    vc.submit("c1", JobSpec(project="c", gpus=1))
    plan = decide(vc.state, vc.now).events
    assert any(isinstance(x, JobNominated) and x.job_id == "c1" for x in plan)
    stops = [(x.job_id, x.replicas) for x in plan if isinstance(x, JobPreemptionRequested)]
    assert stops == [("e", 1)]  # e's other extra, as when the first stop was answered
