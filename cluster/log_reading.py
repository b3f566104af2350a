"""Reading a cluster's whole log from plain (not async) code: `fairlane log export`, `audit`
and `whatif` fold it as they pull it.

The cluster is the one at a NATS URL, or the one recorded in a data folder, which is read as
its admin user (reading the whole stream is an operator's act); with a URL, as the user whose
credentials file FAIRLANE_NATS_CREDENTIALS names, if any.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec
import nats.errors as nats_errors

from cluster.cluster_file import read_cluster
from policy.audit import Reader
from services.runtime.auth import ADMIN, Credentials, load_credentials
from services.runtime.connection import NotAuthorized, connect
from services.runtime.eventlog import JetStreamLog
from services.runtime.log_reader import blocking_reader
from services.runtime.main import configure_logging

T = TypeVar("T")
CONNECT_WITHIN_S: Final = 10.0


class LogUnreachable(RuntimeError):
    """The log cannot be read; the message says why."""


def where(data_dir: Path, nats: str | None) -> tuple[str, Credentials | None]:
    """Where the log is and whom to read it as."""
    if nats is not None:
        return nats, None
    running = read_cluster(data_dir.resolve())
    if running is None:
        raise LogUnreachable(f"no cluster runs from {data_dir} (start one: fairlane up)")
    if not running.credentials_dir:  # a server not started here: no users of ours
        return running.nats_url, None
    path = Path(running.credentials_dir) / f"{ADMIN}.json"
    try:
        return running.nats_url, load_credentials(path)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        message = f"the cluster's admin credentials {path}: cannot read them ({e})"
        raise LogUnreachable(message) from e


@contextmanager
def stream(url: str, credentials: Credentials | None) -> Iterator[tuple[Reader, int]]:
    """The stream as a `Reader`, with the number of events it holds, read through an event
    loop in a thread of its own, so that plain code pulls the events as it folds them."""
    configure_logging("error")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="log-reader", daemon=True)
    thread.start()

    def on_loop(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    nc = None
    try:
        # bounded: a server that does not answer is not waited for past CONNECT_WITHIN_S
        nc = on_loop(
            asyncio.wait_for(
                connect(url, "fairlane-log-reader", retry_for=5, credentials=credentials),
                CONNECT_WITHIN_S,
            )
        )
        log = JetStreamLog(nc)
        end = on_loop(log.last_seq())
        yield blocking_reader(log, loop, end), end
    except TimeoutError as e:
        raise LogUnreachable(
            f"cannot read the log at {url}: no connection within {CONNECT_WITHIN_S:g} s"
            " (is the server up, and does it let this user in?)"
        ) from e
    except (OSError, nats_errors.Error, NotAuthorized) as e:
        raise LogUnreachable(f"cannot read the log at {url}: {e or type(e).__name__}") from e
    finally:
        if nc is not None:
            on_loop(nc.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
