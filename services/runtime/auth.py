"""Who may do what on the bus: one NATS user per service, each allowed only its own subjects.

Without this, any client (a tenant's own workload included) could publish a placement or a
completion of another team's job, squat the leaders' lease keys, forge a `NodeLost` or a
snapshot, or delete the stream. With it, the server itself refuses all of that:

- only the scheduler publishes placements and only the preemptor preemptions and nominations,
  and each writes only its own lease key and term subject;
- only an executor registers its node (`fl.node.<its node>.node_registered`, nothing else of
  the node's: only the node watcher declares a node lost, a node never itself) and publishes
  the reports of attempts on its own node (`fl.job.*.<event>.<its node>`);
- only the node watcher relays work to a node (`fl-work.<node>`, in the relay stream), and an
  executor reads only its own node's work, through its own consumer (it reads nothing else of the
  relay stream, nor the log); no other user may make, bind, pull from, ack or delete that consumer,
  nor the projector's, nor any other service's (each is named in advance, `<service>-<instance>`,
  and denied by name);
- only the ledger writes configuration events (a node's cordon among them) and snapshots;
- executors read and write the objects of the cluster's checkpoint store (a job resumes on any
  node, so any node's executor reads any job's; the object store's subjects carry no job to
  scope a grant by);
- admission alone records submissions and their verdicts;
- clients (the CLI, workloads) reach only the command subjects and their own replies;
- only the admin user creates, changes or deletes streams and buckets (`fairlane up` does that
  once, before any service starts: see cluster/provision.py).

Every user gets its own inbox prefix (`_INBOX_<user>`), so nobody can read another's replies.
Readers get what reading the log takes (stream info, consumers, pull, ack, message get), never
the subjects that purge, delete or change a stream.

The servers of a cluster authenticate one another too: a route port takes only a server that
logs in as the routes' user (`Cluster`, `route_credentials`), or anyone who reached it would
join as a server and see every message.

`write_auth` generates the passwords into `<data>/credentials/<user>.json` (mode 0600, in a
0700 folder) and the server's `authorization` block into a config file (mode 0600). Passwords
are never logged; services read theirs from the file named by `FAIRLANE_NATS_CREDENTIALS`.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Final

import msgspec

from events.catalogue import set_aside_subject
from events.commands import ADMISSION_SUBJECT, LEDGER_SUBJECT
from services.runtime.checkpoint_bucket import BUCKET as CHECKPOINTS
from services.runtime.gpu_samples import BUCKET as GPU_SAMPLES
from services.runtime.heartbeats import BUCKET as HEARTBEATS
from services.runtime.lease import BUCKET as LEASES
from services.runtime.snapshots import BUCKET as SNAPSHOTS

#: Where a process finds its own credentials file (set by whoever starts it).
CREDENTIALS_ENV: Final = "FAIRLANE_NATS_CREDENTIALS"
#: eventlog.STREAM, which cannot be imported here (the event log connects through this module);
#: tests/test_auth.py checks they agree
STREAM: Final = "FAIRLANE"
#: relays.RELAY_STREAM and a relay's subject prefix (events.work_subject), likewise checked
RELAY_STREAM: Final = "FAIRLANE_WORK"
RELAY_PREFIX: Final = "fl-work"
#: logstream.LOG_STREAM and LOG_PREFIX: the workloads' output (tests/test_auth.py checks them)
LOG_STREAM: Final = "FAIRLANE_LOGS"
LOG_PREFIX: Final = "fairlane.logs"
SERVICES: Final = (
    "admission",
    "ledger",
    "scheduler",
    "preemptor",
    "nodewatch",
    "projector",
    "api",
)
ADMIN: Final = "admin"
#: projector.service.DEFAULT_NAME: the read models' position name a cluster's projector uses
PROJECTION_NAME: Final = "main"
#: The services that read the log's tail through durable consumers of their own
#: (services/runtime/main.py), one per instance.
DURABLE_READERS: Final = ("admission", "ledger", "scheduler", "preemptor", "nodewatch")
#: How many instances of each may run (one leads or serves, the others stand by): instance
#: `n` reads through the consumer `<service>-<n>`, a name fixed in advance so that every other
#: user can be refused it by name.
INSTANCES: Final = 4
CLIENT: Final = "client"

#: The job events each writer records (`fl.job.<job id>.<event>`; an executor's reports,
#: `fl.job.<job id>.<event>.<node>`).
ADMISSION_EVENTS: Final = (
    "job_submitted",
    "job_admitted",
    "job_rejected",
    "job_cancelled",
    "job_paused",
    "job_resumed",
    "job_priority_changed",
)
EXECUTOR_EVENTS: Final = (
    "job_started",
    "job_preempted",
    "job_checkpointed",
    "job_completed",
    "job_failed",
    # what workloads put on their own timeline, checked and published by their executor
    "job_progress",
    "job_message",
)
DECISIONS: Final = {
    "scheduler": ("job_scheduled",),
    "preemptor": ("job_preemption_requested", "job_nominated"),
}


class Credentials(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    user: str
    password: str
    inbox_prefix: str


class Permissions(msgspec.Struct, frozen=True, omit_defaults=True):
    publish: list[str]
    subscribe: list[str]
    #: may answer the requests it receives (and nothing else by way of replies)
    allow_responses: bool = False
    #: refused even where `publish` allows it (the server's deny wins over its allow)
    deny_publish: list[str] = []

    def server_config(self) -> dict[str, object]:
        """As nats-server's `permissions` block reads it."""
        config: dict[str, object] = msgspec.to_builtins(self)
        if self.deny_publish:
            config["publish"] = {"allow": self.publish, "deny": config.pop("deny_publish")}
        return config


def inbox_prefix(user: str) -> str:
    return f"_INBOX_{_token(user)}"


def executor_user(node: str) -> str:
    return f"executor-{_token(node)}"


def _token(name: str) -> str:
    """A name as one subject token (no '.', wildcards or spaces)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _reading(stream: str) -> list[str]:
    """What reading a stream takes: its info, consumers of one's own, pulling, acking, and
    fetching single messages. Not purge, delete, update or message delete."""
    api = "$JS.API"
    return [
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.DURABLE.CREATE.{stream}.>",
        f"{api}.CONSUMER.INFO.{stream}.>",
        f"{api}.CONSUMER.DELETE.{stream}.>",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def _log_reader() -> list[str]:
    """The event log and the snapshots every fold starts from (reading an object looks its
    stream up by subject: STREAM.NAMES)."""
    return [*_reading(STREAM), *_reading(f"OBJ_{SNAPSHOTS}"), "$JS.API.STREAM.NAMES"]


def _jobs(events: tuple[str, ...], node: str | None = None) -> list[str]:
    """The subjects of these job events (`subject_for`): of a node's reports, only those
    that name `node` (`fl.job.<job>.<event>.<node>`)."""
    return [f"fl.job.*.{event}" + ("" if node is None else f".{node}") for event in events]


def permissions(user: str, nodes: list[str] | tuple[str, ...] = ()) -> Permissions | None:
    """The permissions of one user, in a cluster of `nodes`; None for the admin (everything)."""
    if user == ADMIN:
        return None
    inbox = [f"{inbox_prefix(user)}.>"]
    if user.startswith("executor-"):
        return _executor(user.removeprefix("executor-"), inbox)
    grant = _GRANTS.get(user)
    if grant is None:
        raise ValueError(f"no permissions defined for NATS user {user!r}")
    granted = grant(user, inbox)
    if any(p.startswith("$JS.API.CONSUMER.") for p in granted.publish):
        # A reader's grants name consumers by a wildcard (the server names an ephemeral one,
        # and a subject permission matches whole tokens only, never a name's prefix), which
        # would let it pull, ack or delete an executor's consumer: a reader that pulled an
        # executor's work took it from the executor, and the jobs never started. Every
        # executor's consumer has a fixed name, so each is refused by name.
        # The projector's consumer likewise: a reader that pulled from it took events from
        # the read models. Each service may make, bind and delete only consumers of its own.
        # So are the other services' consumers, one per instance.
        pinned = [executor_consumer(node) for node in nodes]
        if user != "projector":
            pinned.append(projector_consumer())
        pinned += [
            service_consumer(service, instance)
            for service in DURABLE_READERS
            if service != user
            for instance in range(INSTANCES)
        ]
        deny = [s for consumer in pinned for s in _consumer_subjects(STREAM, consumer)]
        if user == "nodewatch":  # the only reader of the relay stream but executors
            deny += [
                s
                for node in nodes
                for s in _consumer_subjects(RELAY_STREAM, executor_consumer(node))
            ]
        granted = msgspec.structs.replace(granted, deny_publish=deny)
    return granted


_COMMANDS: Final = [ADMISSION_SUBJECT, LEDGER_SUBJECT]


def _client(user: str, inbox: list[str]) -> Permissions:
    return Permissions(publish=list(_COMMANDS), subscribe=inbox)


def _admission(user: str, inbox: list[str]) -> Permissions:
    publish = [*_log_reader(), *_jobs(ADMISSION_EVENTS), set_aside_subject(user)]
    return Permissions(publish, [*inbox, ADMISSION_SUBJECT], allow_responses=True)


def _ledger(user: str, inbox: list[str]) -> Permissions:
    publish = [
        *_log_reader(),
        "fl.project.>",
        "fl.pool.>",
        "fl.cluster.>",
        "fl.node.*.node_cordoned",
        "fl.node.*.node_uncordoned",
        set_aside_subject(user),
    ]
    # writing a snapshot: its chunks and metadata, and purging the previous one's chunks
    publish += [f"$O.{SNAPSHOTS}.>", f"$JS.API.STREAM.PURGE.OBJ_{SNAPSHOTS}"]
    return Permissions(publish, [*inbox, LEDGER_SUBJECT], allow_responses=True)


def _decider(user: str, inbox: list[str]) -> Permissions:
    publish = _log_reader() + _jobs(DECISIONS[user]) + [f"fl.leader.{user}"]
    publish.append(set_aside_subject(user))  # an event it cannot handle, set aside
    publish += [*_reading(f"KV_{LEASES}"), f"$KV.{LEASES}.{user}"]
    return Permissions(publish, inbox)


def _nodewatch(user: str, inbox: list[str]) -> Permissions:
    publish = [*_log_reader(), "fl.node.*.node_lost", f"fl.leader.{user}"]
    # each node's work, fenced on its term recorded in the relay stream too, and reading the
    # relay stream back (where a new leader's relaying starts)
    publish += [f"{RELAY_PREFIX}.*", f"{RELAY_PREFIX}.leader.{user}", *_reading(RELAY_STREAM)]
    publish.append(set_aside_subject(user))  # a relay it cannot write, an event it cannot fold
    publish += [*_reading(f"KV_{LEASES}"), f"$KV.{LEASES}.{user}"]
    publish += _reading(f"KV_{HEARTBEATS}")
    return Permissions(publish, inbox)


def _projector(user: str, inbox: list[str]) -> Permissions:
    # an event the read models cannot hold, set aside
    return Permissions([*_log_reader(), set_aside_subject(user)], inbox)


def _api(user: str, inbox: list[str]) -> Permissions:
    publish = _log_reader() + _COMMANDS + _reading(LOG_STREAM)
    publish += _reading(f"KV_{GPU_SAMPLES}")  # the GPUs' samples, to show them
    return Permissions(publish, inbox)


def executor_consumer(node: str) -> str:
    """The one consumer an executor reads its work with: services/executor/__main__.py names
    its durable consumer so."""
    return executor_user(node)


def projector_consumer(name: str = PROJECTION_NAME) -> str:
    """The one consumer the projector writing the read models `name` reads the log with
    (services/projector/__main__.py): one per name, since one projector writes each."""
    return f"projector-{_token(name)}"


def service_consumer(service: str, instance: int) -> str:
    """The consumer instance `instance` of `service` reads the log's tail with."""
    if not 0 <= instance < INSTANCES:
        raise ValueError(f"instance {instance} of {service}: not one of 0..{INSTANCES - 1}")
    return f"{service}-{instance}"


def _consumer_subjects(stream: str, consumer: str) -> list[str]:
    """Every subject that makes, binds, reads, acks or deletes the consumer `consumer`."""
    api = "$JS.API.CONSUMER"
    return [
        f"{api}.CREATE.{stream}.{consumer}",
        f"{api}.CREATE.{stream}.{consumer}.>",
        f"{api}.DURABLE.CREATE.{stream}.{consumer}",
        f"{api}.INFO.{stream}.{consumer}",
        f"{api}.DELETE.{stream}.{consumer}",
        f"{api}.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
        f"$JS.FC.{stream}.{consumer}.>",
    ]


def _own_work(node: str) -> list[str]:
    """Reading one node's relayed work and nothing else of the relay stream or the log: the
    consumer's create request names its filter in the subject
    (`CONSUMER.CREATE.<stream>.<name>.<filter>`), so the server refuses one that filters on
    anything else; no message get, no other consumer."""
    api, consumer, stream = "$JS.API", executor_consumer(node), RELAY_STREAM
    return [
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.{consumer}.{RELAY_PREFIX}.{node}",
        f"{api}.CONSUMER.INFO.{stream}.{consumer}",
        f"{api}.CONSUMER.DELETE.{stream}.{consumer}",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
        f"$JS.FC.{stream}.{consumer}.>",
    ]


def _executor(node: str, inbox: list[str]) -> Permissions:
    # the reports of attempts on its own node only: the subject keeps one node from speaking
    # for another (and the fold takes a report only from a node the attempt has a replica on)
    publish = _own_work(node) + _jobs(EXECUTOR_EVENTS, node)
    # its node's registration only: a NodeLost of its own node would stop every attempt there
    # (only the node watcher, which watches the heartbeats, declares a node lost)
    publish.append(f"fl.node.{node}.node_registered")
    publish += [*_reading(f"KV_{HEARTBEATS}"), f"$KV.{HEARTBEATS}.{node}"]
    # its own node's GPU samples, under its node's key only
    publish += [*_reading(f"KV_{GPU_SAMPLES}"), f"$KV.{GPU_SAMPLES}.{node}"]
    # its own node's workload output, and where its shipping of a replica got to
    publish += [f"{LOG_PREFIX}.{node}.>", f"$JS.API.STREAM.INFO.{LOG_STREAM}"]
    publish += [f"$JS.API.DIRECT.GET.{LOG_STREAM}.{LOG_PREFIX}.{node}.>"]
    # the cluster's checkpoint store: reading and writing objects (a put purges the chunks
    # of the object it replaces; a get finds the stream by subject: STREAM.NAMES), never
    # creating, changing or deleting the bucket
    publish += [*_reading(f"OBJ_{CHECKPOINTS}"), f"$O.{CHECKPOINTS}.>"]
    publish += [f"$JS.API.STREAM.PURGE.OBJ_{CHECKPOINTS}", "$JS.API.STREAM.NAMES"]
    return Permissions(publish, inbox)


_GRANTS: Final = {
    CLIENT: _client,
    "admission": _admission,
    "ledger": _ledger,
    "scheduler": _decider,
    "preemptor": _decider,
    "nodewatch": _nodewatch,
    "projector": _projector,
    "api": _api,
}


def users(nodes: list[str]) -> list[str]:
    return [ADMIN, CLIENT, *SERVICES, *(executor_user(n) for n in nodes)]


def node_of(creds: Credentials) -> str | None:
    """The node whose executor these credentials are for (None: not an executor's)."""
    prefix = executor_user("")
    return creds.user.removeprefix(prefix) if creds.user.startswith(prefix) else None


def known_nodes(data_dir: Path) -> list[str]:
    """The nodes whose executor users were made before (their credentials files are in
    `data_dir`), in name order."""
    found: list[str] = []
    for path in sorted(credentials_dir(data_dir).glob(f"{executor_user('')}*.json")):
        creds = _existing(path, path.stem)
        node = node_of(creds) if creds is not None else None
        if node:
            found.append(node)
    return found


def credentials_dir(data_dir: Path) -> Path:
    return data_dir / "credentials"


def credentials_file(data_dir: Path, user: str) -> Path:
    return credentials_dir(data_dir) / f"{user}.json"


#: The user one nats-server of a cluster connects to another's route port as: not a client
#: user (it is in no server's `authorization` block, and no client may use it).
ROUTE_USER: Final = "route"


class Cluster(msgspec.Struct, frozen=True):
    """How the servers of one NATS cluster reach each other: the cluster's name, where this
    server listens for routes, and every server's route address (`host:port`, its own among
    them: a server ignores a route to itself)."""

    name: str
    listen: str
    routes: list[str]


def route_credentials(data_dir: Path) -> Credentials:
    """The routes' user and password (made once, then kept: a server restarted with a new
    one would be cut off from the others)."""
    path = credentials_file(data_dir, ROUTE_USER)
    creds = _existing(path, ROUTE_USER)
    if creds is None:
        creds = Credentials(ROUTE_USER, secrets.token_urlsafe(32), inbox_prefix(ROUTE_USER))
        _write_private(path, msgspec.json.encode(creds))
    return creds


def route_urls(creds: Credentials, routes: list[str]) -> list[str]:
    """Route URLs that log in as the routes' user (its password is URL-safe)."""
    return [f"nats-route://{creds.user}:{creds.password}@{route}" for route in routes]


def _cluster_block(data_dir: Path, cluster: Cluster) -> dict[str, object]:
    """A cluster whose route port takes only servers that know the routes' password: without
    it, anyone who reaches the port joins as a server, and sees and sends every message of
    every account, whatever the users' permissions."""
    creds = route_credentials(data_dir)
    return {
        "name": cluster.name,
        "listen": cluster.listen,
        "authorization": {"user": creds.user, "password": creds.password, "timeout": 2},
        "routes": route_urls(creds, cluster.routes),
    }


def write_auth(
    data_dir: Path, config: Path, nodes: list[str], cluster: Cluster | None = None
) -> dict[str, Path]:
    """Generate a password for every user (kept if already generated: a restarted cluster's
    clients keep working), write each to its own 0600 file and the server's authorization
    block to `config` (0600). Returns each user's credentials file. With `cluster`, the
    config has the cluster's block too, its routes logging in as `ROUTE_USER`.

    The nodes made before stay in the config beside `nodes`: adding a node that joins later
    (`fairlane node credentials`, `fairlane deploy secrets --node`) never takes another
    node's user away; a node's user goes only with its credentials file."""
    folder = credentials_dir(data_dir)
    nodes = list(dict.fromkeys([*nodes, *known_nodes(data_dir)]))
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    files: dict[str, Path] = {}
    entries: list[dict[str, object]] = []
    for user in users(nodes):
        path = credentials_file(data_dir, user)
        creds = _existing(path, user) or Credentials(
            user=user, password=secrets.token_urlsafe(32), inbox_prefix=inbox_prefix(user)
        )
        _write_private(path, msgspec.json.encode(creds))
        files[user] = path
        entry: dict[str, object] = {"user": user, "password": creds.password}
        granted = permissions(user, nodes)
        if granted is not None:
            entry["permissions"] = granted.server_config()
        entries.append(entry)
    server: dict[str, object] = {"authorization": {"users": entries}}
    if cluster is not None:
        server["cluster"] = _cluster_block(data_dir, cluster)
    # nats-server reads JSON as its own config format
    _write_private(config, msgspec.json.encode(server))
    return files


def _existing(path: Path, user: str) -> Credentials | None:
    try:
        creds = load_credentials(path)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return creds if creds.user == user else None


def _write_private(path: Path, data: bytes) -> None:
    """Write a secret so that it is never readable by others, not even for a moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def load_credentials(path: Path) -> Credentials:
    return msgspec.json.decode(path.read_bytes(), type=Credentials)


def credentials_from_env() -> Credentials | None:
    """This process's credentials, if whoever started it named a file."""
    path = os.environ.get(CREDENTIALS_ENV)
    return load_credentials(Path(path)) if path else None
