"""The API docs (Redoc, at /docs) served from the package: the Redoc bundle is shipped in
services/api/docs_assets/ (see its README.md), so the page works offline; by default Litestar
points the page at a CDN, and the page stays blank where that cannot be reached."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from litestar.openapi.plugins import OpenAPIRenderPlugin, RedocRenderPlugin, SwaggerRenderPlugin
from litestar.static_files import create_static_files_router
from litestar.types import ControllerRouterHandler

ASSETS: Final = Path(__file__).resolve().parent / "docs_assets"
ASSETS_PATH: Final = "/docs-assets"


def pages() -> list[OpenAPIRenderPlugin]:
    """/docs: Redoc from this server, with the browser's own fonts (not Google's) and no icon
    from a CDN, so nothing on the page is fetched from elsewhere; /docs/swagger as before
    (Swagger UI, from its CDN)."""
    redoc = RedocRenderPlugin(
        js_url=f"{ASSETS_PATH}/redoc.standalone.js",
        google_fonts=False,
        favicon="<link rel='icon' href='data:,'>",
        path="/",
    )
    return [redoc, SwaggerRenderPlugin(path="/swagger")]


def docs_assets() -> ControllerRouterHandler:
    return create_static_files_router(
        path=ASSETS_PATH, directories=[ASSETS], name="docs-assets", include_in_schema=False
    )
