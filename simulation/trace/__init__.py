"""The trace simulator behind `fairlane simulate`: workload traces replayed through the policy
on a virtual clock.

The pieces, in the order a run uses them: `traces` reads a trace into `TraceJob`s, `workload`
shapes them into gangs and sets quotas, `cluster` builds the nodes and projects, `policies` says
how each baseline maps onto a scheduler, `run` drives `simulation.virtual_cluster.VirtualCluster`
(the same policy code the services run), `metrics` measures from its events, and `report` and
`plots` present the result.
"""
