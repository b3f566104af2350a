"""Authentication and least privilege on a real nats-server: forgeries refused by the server.

Each forgery is tried twice: by the client user (the CLI's, and what a tenant's workload could
get hold of), which the server must refuse and not store, and by the one user allowed to write
there, which must work, so a refusal is the permissions' doing and not a broken publish.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import stat
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client

from cluster.provision import provision
from cluster.servers import NatsServer
from events import (
    Event,
    EventSetAside,
    JobAdmitted,
    JobCompleted,
    JobScheduled,
    JobSpec,
    JobSubmitted,
    LeaderElected,
    NodeLost,
    NodeRegistered,
    PoolConfigured,
    ProjectConfigured,
    ProjectTerms,
    Replica,
    WorkRelayed,
    encode_event,
    subject_for,
    work_subject,
)
from events.commands import SetPool, SetProject
from policy.snapshot import encode_snapshot
from policy.state import ClusterState
from services.executor.storage import ObjectCheckpoints, object_name
from services.nodewatch.service import TIMEOUT_ENV
from services.runtime import auth, logstream
from services.runtime.auth import (
    ADMIN,
    CLIENT,
    CREDENTIALS_ENV,
    credentials_dir,
    executor_consumer,
    executor_user,
    known_nodes,
    load_credentials,
    node_of,
    projector_consumer,
    service_consumer,
    write_auth,
)
from services.runtime.checkpoint_bucket import BUCKET as CHECKPOINTS
from services.runtime.checkpoint_bucket import JetStreamCheckpoints
from services.runtime.connection import connect
from services.runtime.eventlog import STREAM, JetStreamLog
from services.runtime.gpu_samples import BUCKET as SAMPLES
from services.runtime.gpu_samples import GpuSample, NodeSamples, encode, read_all, samples_bucket
from services.runtime.host import NatsHost
from services.runtime.lease import Lease
from services.runtime.main import instance_number
from services.runtime.relays import RELAY_STREAM, relay_log, term_subject
from services.runtime.snapshots import SnapshotStore
from services.runtime.tasks import cancel_and_wait
from tests.process_cluster import (
    ProcessCluster,
    audit,
    command,
    open_log,
    replay,
    submit,
    wait_until_done,
)

NODE = "n0"


@dataclass
class Secured:
    server: NatsServer
    files: dict[str, Path]
    data_dir: Path

    async def connect(self, user: str, errors: list[str] | None = None) -> Client:
        """A connection as `user`; the server's complaints to it go into `errors`."""
        creds = load_credentials(self.files[user])

        async def on_error(e: Exception) -> None:
            if errors is not None:
                errors.append(str(e))

        return await nats.connect(
            self.server.url,
            user=creds.user,
            password=creds.password,
            inbox_prefix=creds.inbox_prefix,
            error_cb=on_error,
        )


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Secured]:
    files = write_auth(tmp_path, tmp_path / "auth.conf", [NODE])
    server = NatsServer(store_dir=tmp_path / "nats", config=tmp_path / "auth.conf")
    await server.start()
    admin = await connect(server.url, "admin", credentials=load_credentials(files[ADMIN]))
    await provision(admin.jetstream())
    await admin.close()
    try:
        yield Secured(server, files, tmp_path)
    finally:
        await server.stop()


async def stored_count(secured: Secured, stream: str) -> int:
    nc = await secured.connect(ADMIN)
    try:
        return int((await nc.jetstream().stream_info(stream)).state.messages)
    finally:
        await nc.close()


async def try_publish(secured: Secured, user: str, subject: str, payload: bytes) -> list[str]:
    """Publish to a stream subject as `user` (until the stream's ack, or the server's refusal:
    it drops a refused message, so waiting for the ack's timeout would only take longer);
    returns what the server complained of."""
    errors: list[str] = []
    nc = await secured.connect(user, errors)
    asking = asyncio.create_task(awaited(nc.request(subject, payload, timeout=5.0)))
    complaint = asyncio.create_task(refusal(errors, user))
    await asyncio.wait({asking, complaint}, return_when=asyncio.FIRST_COMPLETED)
    await cancel_and_wait(asking)
    await cancel_and_wait(complaint)
    await asyncio.sleep(0.05)  # a complaint that came with the ack
    await nc.close()
    return errors


PLACEMENT = JobScheduled(
    id="forged-placement",
    time=0.0,
    actor="scheduler",
    job_id="victim",
    attempt=1,
    pool="default",
    replicas=(Replica(NODE, (0, 1)),),
)
COMPLETION = JobCompleted(
    id="forged-done", time=0.0, actor=NODE, job_id="victim", attempt=1, node=NODE
)
LOST = NodeLost(id="forged-lost", time=0.0, actor=NODE, node=NODE, reason="lost")
LOST_SUBJECT = subject_for(LOST)
WORK = WorkRelayed(
    id="forged-work", time=0.0, actor="nodewatch", node=NODE, source_seq=1, event=PLACEMENT
)
ASIDE = EventSetAside(
    id="forged-aside",
    time=0.0,
    actor="nodewatch",
    service="nodewatch",
    seq=1,
    subject=work_subject(NODE),
    reason="forged",
)
#: a term in the relay stream: the watcher's relays fenced on the real one would be refused
RELAY_TERM = LeaderElected(
    id="forged-term", time=0.0, actor="x", kind="nodewatch", holder="x", term=99
)
PROJECTOR_ASIDE = msgspec.structs.replace(ASIDE, id="forged-projector-aside", service="projector")

#: forgery: (subject, payload, stream it would land in, the one user allowed to write there)
FORGERIES = {
    "placement": ("fl.job.victim.job_scheduled", encode_event(PLACEMENT), STREAM, "scheduler"),
    "completion": (subject_for(COMPLETION), encode_event(COMPLETION), STREAM, "executor"),
    "node_lost": (f"fl.node.{NODE}.node_lost", encode_event(LOST), STREAM, "nodewatch"),
    "work": (work_subject(NODE), encode_event(WORK), RELAY_STREAM, "nodewatch"),
    "relay_term": (
        term_subject("nodewatch"),
        encode_event(RELAY_TERM),
        RELAY_STREAM,
        "nodewatch",
    ),
    # a forged set-aside would make the node watcher drop a relay
    "set_aside": ("fl.aside.nodewatch", encode_event(ASIDE), STREAM, "nodewatch"),
    "projector_set_aside": (
        "fl.aside.projector",
        encode_event(PROJECTOR_ASIDE),
        STREAM,
        "projector",
    ),
    "lease": ("$KV.fairlane-leases.scheduler", b"squatter", "KV_fairlane-leases", "scheduler"),
    "snapshot": (
        "$O.fairlane-snapshots.M." + base64.urlsafe_b64encode(b"cluster-state").decode(),
        msgspec.json.encode({"name": "cluster-state", "bucket": "fairlane-snapshots"}),
        "OBJ_fairlane-snapshots",
        "ledger",
    ),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
async def test_a_client_cannot_forge(secured: Secured, forgery: str) -> None:
    subject, payload, stream, owner = FORGERIES[forgery]
    before = await stored_count(secured, stream)
    errors = await try_publish(secured, CLIENT, subject, payload)
    assert any("permissions violation" in e.lower() for e in errors), errors
    assert await stored_count(secured, stream) == before, f"the forged {forgery} was stored"
    # the same write by its rightful writer is stored: the refusal was the permissions'
    writer = executor_user(NODE) if owner == "executor" else owner
    assert await try_publish(secured, writer, subject, payload) == []
    assert await stored_count(secured, stream) == before + 1


async def test_only_the_admin_deletes_the_stream(secured: Secured) -> None:
    for user in (CLIENT, "ledger", "scheduler", executor_user(NODE)):
        errors: list[str] = []
        nc = await secured.connect(user, errors)
        assert not await until_refused(errors, user, nc.jetstream().delete_stream(STREAM))
        await nc.close()
        assert await stored_count(secured, STREAM) >= 0  # still there
    admin = await secured.connect(ADMIN)
    assert await admin.jetstream().delete_stream(STREAM)
    await admin.close()


async def test_an_executor_reports_only_for_its_own_node(secured: Secured) -> None:
    other = NodeLost(id="other-lost", time=0.0, actor=NODE, node="n1", reason="lost")
    before = await stored_count(secured, STREAM)
    errors = await try_publish(secured, executor_user(NODE), "fl.node.n1.node_lost", b"x")
    assert any("permissions violation" in e.lower() for e in errors), errors
    errors = await try_publish(secured, "scheduler", "fl.node.n1.node_lost", encode_event(other))
    assert any("permissions violation" in e.lower() for e in errors), errors
    assert await stored_count(secured, STREAM) == before


async def test_an_executor_cannot_declare_its_own_node_lost(secured: Secured) -> None:
    """A NodeLost stops every attempt on the node: only the node watcher may write one."""
    before = await stored_count(secured, STREAM)
    errors = await try_publish(secured, executor_user(NODE), LOST_SUBJECT, encode_event(LOST))
    assert any("permissions violation" in e.lower() for e in errors), errors
    assert await stored_count(secured, STREAM) == before
    # its registration it still writes
    registered = NodeRegistered(id="reg", time=0.0, actor=NODE, node=NODE, pool="default", gpus=1)
    subject = subject_for(registered)
    assert await try_publish(secured, executor_user(NODE), subject, encode_event(registered)) == []
    assert await stored_count(secured, STREAM) == before + 1


async def test_an_executor_reports_only_on_its_own_nodes_subjects(secured: Secured) -> None:
    """A node's report goes on `fl.job.<job>.<event>.<node>`: the server takes an executor's
    only on its own node's, never on another node's nor on one naming no node."""
    elsewhere = msgspec.structs.replace(COMPLETION, id="elsewhere", node="n1")
    unnamed = msgspec.structs.replace(COMPLETION, id="unnamed", node=None)
    before = await stored_count(secured, STREAM)
    for event in (elsewhere, unnamed):
        subject = subject_for(event)
        errors = await try_publish(secured, executor_user(NODE), subject, encode_event(event))
        assert any("permissions violation" in e.lower() for e in errors), (subject, errors)
    assert await stored_count(secured, STREAM) == before
    own = subject_for(COMPLETION)
    assert own == f"fl.job.victim.job_completed.{NODE}"
    assert await try_publish(secured, executor_user(NODE), own, encode_event(COMPLETION)) == []
    assert await stored_count(secured, STREAM) == before + 1


async def test_a_report_naming_another_node_than_its_subject_is_read_as_no_event(
    secured: Secured,
) -> None:
    """The server pins the subject, not what the event says: a report written on the
    executor's own subject that names another node (or none) is skipped by every reader,
    so it never reaches a fold as that node's word."""
    nc = await secured.connect(executor_user(NODE))
    own = JetStreamLog(nc)
    subject = f"fl.job.victim.job_completed.{NODE}"
    for event in (
        msgspec.structs.replace(COMPLETION, id="says-n1", node="n1"),
        msgspec.structs.replace(COMPLETION, id="says-none", node=None),
    ):
        await own.publish_raw(subject, encode_event(event))
    await own.publish(COMPLETION)
    await nc.close()
    reader = JetStreamLog(await secured.connect(ADMIN))
    read = [s.event.id async for s in reader.read(1)]
    assert read == [COMPLETION.id]
    assert reader.skipped == 2
    await reader.nc.close()


async def test_a_node_cannot_complete_a_job_running_on_another(secured: Secured) -> None:
    """An executor's credentials completed a job running on another node, and that node
    killed it. Now its report is stored (on its own subject) and the fold refuses it."""
    state = ClusterState()
    setup: list[Event] = [
        PoolConfigured(id="pool", time=0.0, actor="ledger", pool="default"),
        NodeRegistered(id="n1", time=0.0, actor="n1", node="n1", pool="default", gpus=2),
        ProjectConfigured(
            id="proj", time=0.0, actor="ledger", project="a",
            terms={"default": ProjectTerms(quota=2)},
        ),
        JobSubmitted(id="sub", time=0.0, actor="admission", job_id="victim",
                     spec=JobSpec(project="a", gpus=2)),
        JobAdmitted(id="adm", time=0.0, actor="admission", job_id="victim", project="a",
                    priority=0, preemptible=True, gpus=2, replicas=1, min_replicas=1,
                    pools=("default",)),
        msgspec.structs.replace(PLACEMENT, replicas=(Replica("n1", (0, 1)),)),
    ]  # fmt: skip
    admin = JetStreamLog(await secured.connect(ADMIN))
    for event in setup:
        await admin.publish(event)
    nc = await secured.connect(executor_user(NODE))
    await JetStreamLog(nc).publish(COMPLETION)  # n0 says it completed what runs on n1
    await nc.close()
    verdicts = {s.event.id: state.apply(s.event, s.seq) async for s in admin.read(1)}
    await admin.nc.close()
    assert verdicts[PLACEMENT.id].applied
    assert verdicts[COMPLETION.id].reason == f"node {NODE} holds no replica of attempt 1"
    assert state.jobs["victim"].phase == "starting"


def relay(node: str, seq: int) -> WorkRelayed:
    lost = NodeLost(id=f"lost-{node}-{seq}", time=0.0, actor="nodewatch", node=node)
    return WorkRelayed(
        id=f"work/{node}/{seq}", time=0.0, actor="nodewatch", node=node, source_seq=seq, event=lost
    )


async def test_an_executor_reads_only_its_own_work_and_cannot_write_any(secured: Secured) -> None:
    watcher = relay_log(JetStreamLog(await secured.connect("nodewatch")))
    for seq, node in enumerate((NODE, "n1", NODE), start=1):
        await watcher.publish(relay(node, seq))  # only the node watcher writes work
    await watcher.publish(RELAY_TERM)  # and its terms, in the same stream
    # an executor writes no work, its own node's or another's, nor a term
    for subject in (work_subject(NODE), work_subject("n1"), term_subject("nodewatch")):
        errors = await try_publish(secured, executor_user(NODE), subject, b"x")
        assert any("permissions violation" in e.lower() for e in errors), errors

    # its own work, through its own consumer: all of it, and nothing else
    errors = []
    nc = await secured.connect(executor_user(NODE), errors)
    own = relay_log(JetStreamLog(nc, durable=executor_consumer(NODE)))
    read = [s.event async for s in own.read(1, subject=work_subject(NODE))]
    assert [e.id for e in read] == [f"work/{NODE}/1", f"work/{NODE}/3"]
    assert errors == []
    # another node's work, the terms, the whole relay stream or log, or any message by its
    # sequence: refused
    js = nc.jetstream()
    for attempt in (
        lambda: anext(aiter(own.read(1, subject=work_subject("n1")))),
        lambda: anext(aiter(own.read(1, subject=term_subject("nodewatch")))),
        lambda: anext(aiter(own.read(1, subject=work_subject(">")))),
        lambda: anext(aiter(relay_log(JetStreamLog(nc)).read(1))),
        lambda: anext(aiter(JetStreamLog(nc).read(1))),
        lambda: js.get_msg(RELAY_STREAM, 2),
        lambda: js.get_msg(STREAM, 1),
    ):
        assert not await until_refused(errors, executor_user(NODE), attempt())
    await nc.close()
    await watcher.nc.close()


async def awaited(attempt: Awaitable[object]) -> None:
    await attempt


async def refusal(errors: list[str], user: str, within: float = 5.0) -> None:
    """Until the server's complaint of a permissions violation has arrived."""
    deadline = asyncio.get_running_loop().time() + within
    while not any("permissions violation" in e.lower() for e in errors):
        assert asyncio.get_running_loop().time() < deadline, (user, errors)
        await asyncio.sleep(0.01)


async def until_refused(errors: list[str], user: str, attempt: Awaitable[object]) -> bool:
    """Make `attempt` until the server complains of a permissions violation (it drops a
    refused request, so waiting for the request's timeout would only take longer); whether
    the attempt had succeeded by then (a message sent without waiting for an answer has)."""
    errors.clear()
    trying = asyncio.create_task(awaited(attempt))
    try:
        await refusal(errors, user)
    finally:
        await cancel_and_wait(trying)
    return not trying.cancelled() and trying.exception() is None


async def refused_on_consumer(
    secured: Secured, user: str, consumer: str, events: int = 0, stream: str = STREAM
) -> None:
    """`user` tries everything one can do to the consumer `consumer` of `stream`; each is
    refused, and `user` still reads the log (`events` long) with consumers of its own."""
    relays = stream == RELAY_STREAM
    errors: list[str] = []
    nc = await secured.connect(user, errors)
    js = nc.jetstream(timeout=1.0)
    pull = json.dumps({"batch": 10, "expires": 500_000_000}).encode()
    inbox = nc.new_inbox()
    await nc.subscribe(inbox)
    binding = JetStreamLog(nc, durable=consumer)
    for attempt in (
        lambda: nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}", pull, inbox),
        lambda: nc.publish(f"$JS.ACK.{stream}.{consumer}.1.2.2.0.0", b"+ACK"),
        lambda: js.consumer_info(stream, consumer),
        lambda: js.delete_consumer(stream, consumer),
        # binding it as its own durable (which deletes it first, to make it again)
        lambda: anext(
            aiter(
                (relay_log(binding) if relays else binding).read(
                    1, subject=work_subject(">") if relays else "fl.>"
                )
            )
        ),
    ):
        await until_refused(errors, user, attempt())
    errors.clear()
    assert len([s async for s in JetStreamLog(nc).read(1)]) == events
    assert errors == [], (user, errors)
    await nc.close()


async def test_no_service_takes_or_deletes_an_executors_consumer(secured: Secured) -> None:
    """The api's user pulled and acked what was relayed to a node (its jobs stayed
    `starting`): every service reads the log with consumers of its own, and none may pull,
    ack, look at, make or delete an executor's."""
    watcher = relay_log(JetStreamLog(await secured.connect("nodewatch")))
    await watcher.publish(relay(NODE, 1))
    executor = await secured.connect(executor_user(NODE))
    own = relay_log(JetStreamLog(executor, durable=executor_consumer(NODE)))
    # the executor makes its consumer and reads its work through it; more work comes
    assert [s.event.id async for s in own.read(1, subject=work_subject(NODE))] == [f"work/{NODE}/1"]
    await executor.close()  # its pull request goes with it
    await asyncio.sleep(0.2)
    await watcher.publish(relay(NODE, 2))
    await watcher.nc.close()
    consumer = executor_consumer(NODE)
    # the node watcher reads the relay stream (with consumers of its own), the others not at all
    for user in ("api", "scheduler", "nodewatch"):
        await refused_on_consumer(secured, user, consumer, stream=RELAY_STREAM)
    # the executor's consumer is still there, and the new work is still for it to take
    admin = await secured.connect(ADMIN)
    info = await admin.jetstream().consumer_info(RELAY_STREAM, consumer)
    assert (info.delivered.consumer_seq, info.num_pending) == (1, 1), info
    await admin.close()


@pytest.mark.parametrize(
    ("owner", "consumer", "other"),
    [
        ("projector", projector_consumer(), "api"),
        ("admission", service_consumer("admission", 0), "scheduler"),
        ("scheduler", service_consumer("scheduler", auth.INSTANCES - 1), "preemptor"),
    ],
)
async def test_no_other_service_takes_or_deletes_a_services_consumer(
    secured: Secured, owner: str, consumer: str, other: str
) -> None:
    """The projector's consumer and every instance's of the other services are pinned like an
    executor's: another service's user cannot pull from, bind or delete one, and its own
    service's user reads through it."""
    admin = JetStreamLog(await secured.connect(ADMIN))
    await admin.ensure_stream()
    await admin.publish(PoolConfigured(id="p", time=0.0, actor="admin", pool="default"))
    own = JetStreamLog(await secured.connect(owner), durable=consumer)
    assert len([s async for s in own.read(1, subject="fl.>")]) == 1  # its durable
    await own.nc.close()
    await refused_on_consumer(secured, other, consumer, events=1)
    info = await admin.js.consumer_info(STREAM, consumer)  # still there
    assert info.name == consumer
    await admin.nc.close()


def test_an_instance_beyond_the_pinned_names_is_refused() -> None:
    with pytest.raises(ValueError, match=r"instance 4 of scheduler: not one of 0\.\.3"):
        service_consumer("scheduler", auth.INSTANCES)
    with pytest.raises(argparse.ArgumentTypeError, match=r"'7' is not one of 0\.\.3"):
        instance_number("7")
    assert instance_number("3") == 3


async def test_a_client_cannot_read_others_replies_or_the_log(secured: Secured) -> None:
    errors: list[str] = []
    nc = await secured.connect(CLIENT, errors)
    await nc.subscribe("_INBOX.>")
    await nc.subscribe("_INBOX_admission.>")
    await nc.subscribe("fl.>")
    await nc.flush()
    await asyncio.sleep(0.1)
    await nc.close()
    assert sum("permissions violation" in e.lower() for e in errors) == 3, errors


async def test_leases_and_snapshots_work_for_their_owners(secured: Secured) -> None:
    creds = {u: load_credentials(secured.files[u]) for u in ("scheduler", "preemptor", "ledger")}
    scheduler = await connect(secured.server.url, "s", credentials=creds["scheduler"])
    preemptor = await connect(secured.server.url, "p", credentials=creds["preemptor"])
    ledger = await connect(secured.server.url, "l", credentials=creds["ledger"])
    lease = Lease("scheduler", "s1")
    assert await lease.try_acquire(scheduler.jetstream())
    assert await lease.renew(scheduler.jetstream())
    # the preemptor may not write the scheduler's key, even once it lapses
    with pytest.raises(Exception):  # noqa: B017 (a timeout: the server drops it)
        await Lease("scheduler", "p1").try_acquire(preemptor.jetstream(timeout=1.0))
    await SnapshotStore(ledger.jetstream()).save(encode_snapshot(ClusterState(), 6), 6)
    # a newer one replaces it (the old one's chunks purged)
    await SnapshotStore(ledger.jetstream()).save(encode_snapshot(ClusterState(), 7), 7)
    loaded = await SnapshotStore(preemptor.jetstream()).load()
    assert loaded is not None and loaded[1] == 7
    log = JetStreamLog(scheduler)
    await log.ensure_stream()  # info only: it exists
    for nc in (scheduler, preemptor, ledger):
        await nc.close()


async def test_the_node_watcher_watches_the_heartbeats_an_executor_puts(
    secured: Secured,
) -> None:
    """Its host's watch is a consumer on the bucket its user may read (a refused watch would
    end its lead and lose every node)."""
    executor = await secured.connect(executor_user(NODE))
    watcher = await secured.connect("nodewatch")
    try:
        await NatsHost(JetStreamLog(executor)).heartbeats().put(NODE)
        watch = NatsHost(JetStreamLog(watcher)).heartbeats().watch()
        async with asyncio.timeout(5):
            node, _ = await anext(watch)
        assert node == NODE
        await watch.aclose()  # type: ignore[attr-defined]
    finally:
        await executor.close()
        await watcher.close()


async def test_executors_store_and_fetch_checkpoints_and_clients_cannot(
    secured: Secured, tmp_path: Path
) -> None:
    """The cluster's checkpoint store (provisioned by the admin): an executor stores a
    replica's folder, replaces it (the old chunks purged) and fetches it into another folder
    (as the next node would); a client reads none of it; an executor cannot delete the
    bucket."""
    creds = load_credentials(secured.files[executor_user(NODE)])
    executor = await connect(secured.server.url, "e", credentials=creds)
    here, there = tmp_path / "here" / "replica-0", tmp_path / "there" / "replica-0"
    here.mkdir(parents=True)
    store = ObjectCheckpoints(
        JetStreamCheckpoints(executor.jetstream(timeout=2.0)), max_bytes=1 << 20
    )
    digests = []
    for step in (1, 2):
        (here / "state.json").write_text(f'{{"step": {step}}}')
        digests.append((await store.store(here, object_name("j", 0))).digest)
    assert digests[0] and digests[1] and digests[0] != digests[1]
    assert await store.fetch(there, object_name("j", 0))
    assert (there / "state.json").read_text() == '{"step": 2}'
    assert await store.fetch(there, object_name("j", 0)) is None  # it has it already
    with pytest.raises(Exception):  # noqa: B017 (refused, or a timeout: the server drops it)
        await executor.jetstream(timeout=1.0).delete_stream(f"OBJ_{CHECKPOINTS}")
    await executor.close()

    client = await secured.connect(CLIENT)
    with pytest.raises(Exception):  # noqa: B017
        await ObjectCheckpoints(JetStreamCheckpoints(client.jetstream(timeout=1.0)), 1 << 20).fetch(
            tmp_path / "client" / "replica-0", object_name("j", 0)
        )
    await client.close()


def test_the_permissions_name_the_stream_the_log_uses() -> None:
    assert auth.STREAM == STREAM
    assert (auth.RELAY_STREAM, f"{auth.RELAY_PREFIX}.n") == (RELAY_STREAM, work_subject("n"))
    assert (auth.LOG_STREAM, auth.LOG_PREFIX) == (logstream.LOG_STREAM, logstream.LOG_PREFIX)


def test_a_node_added_later_keeps_every_other_nodes_user(tmp_path: Path) -> None:
    """`fairlane node credentials` and `deploy secrets --node` name only the new node: the
    config written again still has the nodes made before, with their passwords."""
    config = tmp_path / "auth.conf"
    first = load_credentials(write_auth(tmp_path, config, [NODE])[executor_user(NODE)])
    files = write_auth(tmp_path, config, ["n1"])
    assert known_nodes(tmp_path) == [NODE, "n1"]
    assert load_credentials(files[executor_user(NODE)]) == first
    users = {u["user"]: u for u in json.loads(config.read_text())["authorization"]["users"]}
    for node in (NODE, "n1"):
        entry = users[executor_user(node)]
        assert entry["password"] == load_credentials(files[executor_user(node)]).password
        assert f"fl.node.{node}.node_registered" in entry["permissions"]["publish"]
    assert node_of(first) == NODE and node_of(load_credentials(files[ADMIN])) is None


def test_credentials_are_private_and_kept(tmp_path: Path) -> None:
    files = write_auth(tmp_path, tmp_path / "auth.conf", [NODE])
    assert stat.S_IMODE(os.stat(credentials_dir(tmp_path)).st_mode) == 0o700
    for path in [*files.values(), tmp_path / "auth.conf"]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    again = write_auth(tmp_path, tmp_path / "auth.conf", [NODE])
    for user, path in files.items():
        assert load_credentials(again[user]) == load_credentials(path)
    passwords = {load_credentials(p).password for p in files.values()}
    assert len(passwords) == len(files)  # every user its own


@pytest.mark.slow
async def test_the_services_work_end_to_end_each_as_its_own_user(
    secured: Secured, tmp_path: Path
) -> None:
    pc = ProcessCluster(secured.server.url, tmp_path)
    try:
        for name in ("admission", "ledger", "scheduler", "preemptor"):
            await pc.start(name, name, env={CREDENTIALS_ENV: str(secured.files[name])})
        # relays the executor's work (a hollow node sends no heartbeats: never lost)
        creds = str(secured.files["nodewatch"])
        await pc.start("nodewatch", "nodewatch", env={CREDENTIALS_ENV: creds, TIMEOUT_ENV: "3600"})
        await pc.start(
            "executor",
            "executor",
            *("--node", NODE, "--gpus", "4", "--hollow", "--hollow-runtime", "0.2"),
            *("--data-dir", str(tmp_path / "executor")),
            env={CREDENTIALS_ENV: str(secured.files[executor_user(NODE)])},
        )
        client = JetStreamLog(
            await connect(
                secured.server.url, "cli", credentials=load_credentials(secured.files[CLIENT])
            )
        )
        reader = await open_log(
            secured.server.url, "auditor", load_credentials(secured.files[ADMIN])
        )
        assert (await command(client, SetPool(pool="default"))).ok
        for _ in range(100):  # the executor registers its node
            state, _ = await replay(reader)
            if state.nodes:
                break
            await asyncio.sleep(0.1)
        reply = await command(client, SetProject(project="a", pool="default", quota=4))
        assert reply.ok, reply.error
        for i in range(12):
            spec = JobSpec(project="a", gpus=1 + i % 2, priority_class="train")
            reply = await submit(client, f"j{i}", spec)
            assert reply.ok, reply.error
        await wait_until_done(reader, 12, within=60)
        _, stored = await replay(reader)
        assert audit(stored) == []
        await client.nc.close()
        await reader.nc.close()
    finally:
        await pc.stop_all()
    logs = [p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log")]
    assert not [line for text in logs for line in text.splitlines() if "violation" in line]


async def test_gpu_samples_an_executor_puts_its_own_and_the_api_reads_them(
    secured: Secured,
) -> None:
    """The GPU samples bucket (provisioned by the admin): an executor puts its own node's
    value and no other node's; the API reads every node's; a client reads none."""
    value = encode(NodeSamples(node=NODE, time=1.0, source="unknown", every_s=5.0,
                               idle_after_s=900.0, gpus=(GpuSample(index=0),)))  # fmt: skip
    creds = load_credentials(secured.files[executor_user(NODE)])
    executor = await connect(secured.server.url, "e", credentials=creds)
    bucket = await samples_bucket(executor.jetstream(timeout=2.0))
    await bucket.put(NODE, value)
    with pytest.raises(Exception):  # noqa: B017 (a timeout: the server drops it)
        await (await samples_bucket(executor.jetstream(timeout=1.0))).put("n1", value)
    await executor.close()
    api = await secured.connect("api")
    (read,) = await read_all(api.jetstream(timeout=2.0), [NODE, "n1"])
    assert read.node == NODE and read.gpus[0].utilization is None
    await api.close()
    client = await secured.connect(CLIENT)
    with pytest.raises(Exception):  # noqa: B017
        await (await client.jetstream(timeout=1.0).key_value(SAMPLES)).get(NODE)
    await client.close()
