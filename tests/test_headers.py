"""The header parse every client uses (services/runtime/headers.py) gives nats-py's result."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client

from cluster.servers import NatsServer
from services.runtime.connection import connect
from services.runtime.headers import parse_header_lines

# the characters that matter: separators, every ASCII whitespace, one non-ASCII byte
PIECES = [b"Nats-Msg-Id", b"a", b"Z9", b":", b": ", b"\r\n", b" ", b"\t", b"\x0b", b"\x0c"]
PIECES += [b"\x1c", b"\x1f", b"\xc3\xa9", b"\xff", b"job/b1/admitted", b"\r", b"\n"]


def test_a_stored_events_headers() -> None:
    raw = b"Nats-Msg-Id: b1/admitted\r\nNats-Expected-Last-Subject-Sequence: 12\r\n\r\n"
    assert parse_header_lines(raw) == {
        "Nats-Msg-Id": "b1/admitted",
        "Nats-Expected-Last-Subject-Sequence": "12",
    }


def test_names_with_any_ascii_character_as_nats_py_reads_them() -> None:
    for code in range(128):
        raw = b"A" + bytes([code]) + b"B: v\r\n" + bytes([code]) + b": w\r\n"
        assert parse_header_lines(raw) == Client._parse_header_lines(raw), code


@given(st.lists(st.sampled_from(PIECES), max_size=30))
def test_any_block_as_nats_py_reads_it(pieces: list[bytes]) -> None:
    raw = b"".join(pieces)
    assert parse_header_lines(raw) == Client._parse_header_lines(raw)


async def test_every_connection_reads_headers_with_it(nats_server: NatsServer) -> None:
    nc = await connect(nats_server.url, "headers")
    try:
        assert nc._parse_header_lines is parse_header_lines
        got: asyncio.Future[dict[str, str] | None] = asyncio.get_running_loop().create_future()

        async def take(msg: object) -> None:
            got.set_result(getattr(msg, "headers", None))

        await nc.subscribe("h", cb=take)
        await nc.publish("h", b"x", headers={"Nats-Msg-Id": "b1/admitted"})
        assert await asyncio.wait_for(got, 5) == {"Nats-Msg-Id": "b1/admitted"}
    finally:
        await nc.close()
