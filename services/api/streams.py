"""Live streams (the event stream, followed output): how many are served at once, and holding a
place while one runs.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from litestar.exceptions import ServiceUnavailableException


class StreamPlaces:
    """The live streams served at once, counted exactly. A place is taken as the request is
    answered, with no await between the check and the taking (a semaphore checked there and
    taken once the stream started let 75 streams in under a cap of 64, the rest waiting
    rather than refused), and given back when the stream ends."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.taken = 0

    def take(self) -> Place:
        if self.taken >= self.most:
            raise ServiceUnavailableException(
                detail=f"too many live streams open (at most {self.most}); try again later"
            )
        self.taken += 1
        return Place(self)


class Place:
    """One live stream's place, given back once: when its stream ends, or, for a stream
    never sent (the client went before it started), when the stream is collected."""

    def __init__(self, places: StreamPlaces) -> None:
        self.places: StreamPlaces | None = places

    def give_back(self) -> None:
        if self.places is not None:
            self.places.taken -= 1
            self.places = None

    def __del__(self) -> None:
        self.give_back()


async def held(place: Place, source: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """The stream, holding its place among the live streams; its consumer is closed as soon
    as the client goes."""
    try:
        async for chunk in source:
            yield chunk
    finally:
        place.give_back()
        await source.aclose()
