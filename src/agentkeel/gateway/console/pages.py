"""The console's page and assets: static files shipped in the package (``console/static/``), so
the console needs no build step, no CDN and no network beyond the gateway itself.

Open without credentials, as ``/docs`` is (``auth.OPEN_PATHS`` / ``OPEN_PREFIXES``): the files are
the same for every deployment and hold no data. Everything the page shows comes from the API with
the credential the user typed into the page (see docs/console.md). The page is sent with a strict
Content-Security-Policy (scripts, styles and fetches from this origin only, no inline script), so a
value from a run that somehow reached the DOM as markup still could not run code or send the
stored key elsewhere; the scripts write run data as text only.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from agentkeel.gateway.errors import NotFound

router = APIRouter(tags=["console"], include_in_schema=False)
STATIC = resources.files("agentkeel.gateway.console") / "static"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> Response:
    suffix = name[name.rfind("."):] if "." in name else ""
    item = STATIC / name
    if suffix not in TYPES or "/" in name or not item.is_file():
        raise NotFound(f"no console asset {name}")
    return Response(item.read_bytes(), media_type=TYPES[suffix], headers=HEADERS)


@router.get("/console")
async def console_page() -> Response:
    return _asset("index.html")


@router.get("/console/assets/{name}")
async def console_asset(name: str) -> Response:
    return _asset(name)
