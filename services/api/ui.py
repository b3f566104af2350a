"""The web dashboard: static files shipped in the package (services/api/dashboard/, plain ES
modules, no build step), served at /ui, and the one route it needs beside the API's own: which
projects the caller's token may act on, so that it shows a person their projects only."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from litestar import Response, get
from litestar.datastructures import CacheControlHeader
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.response import Redirect
from litestar.static_files import create_static_files_router
from litestar.types import ControllerRouterHandler

from services.api.tokens import Caller
from services.api.types import Error, TokenInfo

ASSETS: Final = Path(__file__).resolve().parent / "dashboard"
#: The page runs its own scripts only and talks to this origin only: a script injected through
#: some value shown on the page could read the token from sessionStorage, and this forbids it.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def _secure(response: Response[object]) -> Response[object]:
    response.headers.update(SECURITY_HEADERS)
    return response


@get("/", include_in_schema=False)
async def to_dashboard() -> Redirect:
    return Redirect("/ui/")


@get(
    "/v1/token",
    tags=["access"],
    responses={401: ResponseSpec(Error, description="no token, or an unknown one")},
)
async def whoami(caller: NamedDependency[Caller]) -> TokenInfo:
    """The caller's own token: its name, whether it is an admin's, and its projects."""
    return TokenInfo(caller.name, sorted(caller.projects), caller.admin)


def dashboard_routes() -> list[ControllerRouterHandler]:
    """The handlers `app.py` registers for the dashboard."""
    assets = create_static_files_router(
        path="/ui",
        directories=[ASSETS],
        html_mode=True,
        name="dashboard",
        after_request=_secure,
        cache_control=CacheControlHeader(no_cache=True),
    )
    return [assets, to_dashboard, whoami]
