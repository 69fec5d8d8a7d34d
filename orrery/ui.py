"""The explain page and the API docs, served by the query worker: `/ui`, `/docs`,
`/redoc`, and `/` redirecting to `/ui`.

Everything is a static file of this package (`orrery/ui_static/`: plain HTML, CSS and
JavaScript, no build step) or of `fastapi-offline` (Swagger UI and ReDoc): a page loads
nothing from outside the server. The page calls the public API with the key the person
typed, which it keeps in the tab's `sessionStorage` and sends as `x-api-key` — never in
a URL, so never in an access log.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

from fastapi import APIRouter, HTTPException
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response

__all__ = ["UI_PATH", "create_docs_router", "create_ui_router"]

UI_PATH = "/ui"
_DOCS_ASSETS = "/docs-assets"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
}
# The page may only talk to the server that served it (no inline scripts either).
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'"
)
_HEADERS = {
    "content-security-policy": _CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def _file(root: Traversable, name: str) -> Response:
    suffix = "." + name.rsplit(".", 1)[-1] if "." in name else ""
    if "/" in name or name.startswith(".") or suffix not in _TYPES:
        raise HTTPException(404, f"no file {name!r}")
    path = root / name
    if not path.is_file():
        raise HTTPException(404, f"no file {name!r}")
    return Response(path.read_bytes(), media_type=_TYPES[suffix], headers=_HEADERS)


def create_ui_router() -> APIRouter:
    """`/ui` (the page and its files) and `/` → `/ui`, for a process with the query
    role. Public: the page holds no data; every call it makes carries the key."""
    router = APIRouter(include_in_schema=False)
    ui = resources.files("orrery").joinpath("ui_static")

    @router.get("/")
    async def get_root() -> RedirectResponse:
        return RedirectResponse(UI_PATH, status_code=307)

    @router.get(UI_PATH)
    async def get_ui() -> Response:
        return _file(ui, "index.html")

    @router.get(UI_PATH + "/{name}")
    async def get_ui_file(name: str) -> Response:
        return _file(ui, name)

    return router


def create_docs_router(openapi_url: str = "/openapi.json") -> APIRouter:
    """`/docs` (Swagger UI) and `/redoc` with the files `fastapi-offline` ships."""
    router = APIRouter(include_in_schema=False)
    docs = resources.files("fastapi_offline").joinpath("static")

    @router.get(_DOCS_ASSETS + "/{name}")
    async def get_docs_asset(name: str) -> Response:
        return _file(docs, name)

    @router.get("/docs")
    async def get_docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title="Orrery API",
            swagger_js_url=f"{_DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{_DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{_DOCS_ASSETS}/favicon.png",
        )

    @router.get("/redoc")
    async def get_redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title="Orrery API",
            redoc_js_url=f"{_DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{_DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )

    return router
