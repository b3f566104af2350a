"""Small protocols the tests share: what a helper needs of an object that other modules'
fixtures build, each its own way."""

from __future__ import annotations

from typing import Protocol


class Served(Protocol):
    """Something reached at a base URL (a cluster's API, and the dashboard it serves)."""

    @property
    def url(self) -> str: ...


class Service(Protocol):
    """A service of the cluster (admission, the ledger, a decider, ...): it runs until cancelled."""

    async def run(self) -> None: ...
