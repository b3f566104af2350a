"""`up` waits for its own API: one that refuses the cluster's admin token is another
cluster's, on the same port (two `up`s found the default port free at once), and `up` says so
instead of leaving every command to fail with "unknown API token"."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cluster.embedded import EmbeddedError, _listening

TOKEN = "fl_admin_of_this_cluster"


async def api_answering(status: str, seen: list[bytes]) -> asyncio.Server:
    """An HTTP server on loopback that answers every request with this status line."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(f"HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text(TOKEN + "\n")
    return path


async def listening_on(status: str, tmp_path: Path) -> list[bytes]:
    seen: list[bytes] = []
    server = await api_answering(status, seen)
    port = server.sockets[0].getsockname()[1]
    try:
        async with server:
            await _listening(f"http://127.0.0.1:{port}", token_file(tmp_path), tmp_path, 5.0)
    finally:
        server.close()
    return seen


async def test_up_takes_its_own_api_and_asks_with_its_admin_token(tmp_path: Path) -> None:
    (request,) = await listening_on("200 OK", tmp_path)
    assert request.startswith(b"GET /v1/whoami HTTP/1.1\r\n")
    assert f"Authorization: Bearer {TOKEN}\r\n".encode() in request


async def test_up_names_an_api_of_another_cluster_on_its_port(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedError, match=r"port \d+ answers for another Fairlane cluster"):
        await listening_on("401 Unauthorized", tmp_path)
