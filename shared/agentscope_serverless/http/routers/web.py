"""The chat page: ``GET /`` and its assets under ``/web/``, static files shipped in the package.

The page itself needs no key (it holds no data); everything it fetches does. It loads nothing
from outside its server, and the headers say so: a strict Content-Security-Policy (no inline
script or style, requests to this origin only), no sniffing, no referrer, no framing.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from urllib.parse import quote

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import Receive, Scope, Send

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",
}
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "markdown.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}

router = APIRouter(include_in_schema=False)


@cache
def _read(name: str) -> bytes:
    return (resources.files("agentscope_serverless") / "web" / name).read_bytes()


def _page(name: str, media_type: str) -> Response:
    return Response(_read(name), media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/")
async def chat_page() -> Response:
    return _page("index.html", "text/html; charset=utf-8")


@router.get("/web/app.js")
async def chat_script() -> Response:
    return _page("app.js", ASSETS["app.js"])


@router.get("/web/markdown.js")
async def chat_markdown() -> Response:
    return _page("markdown.js", ASSETS["markdown.js"])


@router.get("/web/app.css")
async def chat_style() -> Response:
    return _page("app.css", ASSETS["app.css"])


class RootPathRedirect(BaseRoute):
    """``GET`` of the root path itself (an API Gateway stage's invoke URL, ``/prod``, as AWS
    prints it), redirected to the chat page at ``/prod/``: no route has the empty path, and
    the page's assets are relative to it. The ``Location`` is built from the root path
    alone (never the ``Host``), its leading slashes as one: it stays on the same origin."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        root = scope.get("root_path", "")
        if (
            scope["type"] == "http"
            and scope["method"] in ("GET", "HEAD")
            and root.strip("/")
            and scope["path"] == root
        ):
            return Match.FULL, {}
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        location = "/" + quote(scope["root_path"].strip("/")) + "/"
        query = scope.get("query_string", b"").decode("latin-1")
        if query:
            location += f"?{query}"
        await RedirectResponse(location)(scope, receive, send)


__all__ = ["CONTENT_SECURITY_POLICY", "RootPathRedirect", "router"]
