"""The chat page: ``GET /`` and its assets under ``/web/``, static files shipped in the package.

The page itself needs no key (it holds no data); everything it fetches does. It loads nothing
from outside its server, and the headers say so: a strict Content-Security-Policy (no inline
script or style, requests to this origin only), no sniffing, no referrer, no framing.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

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


__all__ = ["CONTENT_SECURITY_POLICY", "router"]
