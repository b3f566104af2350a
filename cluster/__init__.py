"""Running a whole cluster: its servers (nats-server, PostgreSQL), provisioning the stream and
buckets, the embedded cluster and its supervisor, its nodes, and the cluster file that says
where a running one is.

This is what sets a cluster up and keeps it running, not what a service does: services never
import it, and the `fairlane` command line reaches the services' code only through it.
"""
