"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol.

A small client on aiohttp's websocket: no browser download, no Playwright. It records every
network request and every console or log message, so a test can assert that a page talks to
its server only and breaks no Content-Security-Policy.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def chromium_binary() -> str:
    """The system Chromium, or a failure that says how to install it."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path is not None:
            return path
    raise AssertionError(
        "chromium is not installed: apt-get install -y chromium (./scripts/bootstrap)"
    )


@dataclass
class Page:
    """A DevTools session, a page's or the browser's: send commands, evaluate JavaScript,
    wait for conditions."""

    socket: aiohttp.ClientWebSocketResponse
    requests: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _pending: dict[int, asyncio.Future[Any]] = field(default_factory=dict)

    async def read(self) -> None:
        async for frame in self.socket:
            if frame.type != aiohttp.WSMsgType.TEXT:
                continue
            message = json.loads(frame.data)
            if "id" in message:
                future = self._pending.pop(message["id"], None)
                if future is not None and not future.done():
                    if "error" in message:
                        future.set_exception(AssertionError(f"CDP error: {message['error']}"))
                    else:
                        future.set_result(message.get("result", {}))
                continue
            self._event(message.get("method", ""), message.get("params", {}))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
        elif method == "Log.entryAdded":
            entry = params["entry"]
            self.messages.append(f"{entry.get('level')}: {entry.get('text')}")
        elif method == "Runtime.consoleAPICalled":
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.messages.append(f"console.{params.get('type')}: {args}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            self.exceptions.append(str(text))

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        await self.socket.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        result: dict[str, Any] = await asyncio.wait_for(future, 30)
        return result

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited)."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, within: float = 30) -> Any:
        """Poll ``expression`` until it is truthy; fail with ``expression`` after ``within`` s."""
        deadline = time.monotonic() + within
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {expression}")
            await asyncio.sleep(0.05)

    async def type_text(self, text: str) -> None:
        """Type ``text`` into the focused element, as a keyboard would."""
        await self.send("Input.insertText", text=text)

    async def press(self, key: str, code: str, key_code: int, modifiers: int = 0) -> None:
        """Press and release one key (``Enter``, ``Tab``...) on the focused element."""
        common = {
            "key": key,
            "code": code,
            "windowsVirtualKeyCode": key_code,
            "modifiers": modifiers,
        }
        text = {"text": "\r"} if key == "Enter" else {}
        await self.send("Input.dispatchKeyEvent", type="keyDown", **common, **text)
        await self.send("Input.dispatchKeyEvent", type="keyUp", **common)

    async def screenshot(self, name: str) -> Path:
        """Save a PNG of the page under ``tests/artifacts/`` and return its path."""
        shot = await self.send("Page.captureScreenshot", format="png")
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@dataclass
class Chromium:
    """A headless Chromium process and the address of its DevTools server."""

    process: subprocess.Popen[str]
    profile: Path
    browser_socket_url: str


_running: Chromium | None = None


@contextlib.contextmanager
def running_chromium() -> Iterator[None]:
    """One headless Chromium (own profile directory) for the pages :func:`chromium_page`
    opens meanwhile."""
    global _running
    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
    process = _launch(profile)
    try:
        _running = Chromium(process, profile, _devtools_socket_url(process))
        yield
    finally:
        _running = None
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(profile, ignore_errors=True)


@contextlib.asynccontextmanager
async def _session(http: aiohttp.ClientSession, url: str) -> AsyncIterator[Page]:
    """A DevTools connection to ``url`` whose events are read while it is open."""
    async with http.ws_connect(url, max_msg_size=0) as socket:
        session = Page(socket)
        reader = asyncio.create_task(session.read())
        try:
            yield session
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


@contextlib.asynccontextmanager
async def chromium_page(width: int = 1280, height: int = 820) -> AsyncIterator[Page]:
    """A fresh page of the running Chromium, in a browser context of its own: no cookie,
    storage or cache of another page."""
    assert _running is not None, "no Chromium is running: open pages within running_chromium()"
    endpoint = _running.browser_socket_url.split("ws://", 1)[1].split("/", 1)[0]
    async with (
        aiohttp.ClientSession() as http,
        _session(http, _running.browser_socket_url) as browser,
    ):
        context = (await browser.send("Target.createBrowserContext"))["browserContextId"]
        try:
            target = await browser.send(
                "Target.createTarget", url="about:blank", browserContextId=context
            )
            async with _session(
                http, f"ws://{endpoint}/devtools/page/{target['targetId']}"
            ) as page:
                for domain in ("Page", "Network", "Runtime", "Log"):
                    await page.send(f"{domain}.enable")
                await page.send(
                    "Emulation.setDeviceMetricsOverride",
                    width=width,
                    height=height,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                yield page
        finally:
            await browser.send("Target.disposeBrowserContext", browserContextId=context)


def _launch(profile: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _devtools_socket_url(process: subprocess.Popen[str]) -> str:
    """The browser's DevTools websocket URL, read from its first lines on stderr."""
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("DevTools listening on ws://"):
            # Keep draining stderr, so a chatty browser never blocks on a full pipe.
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return line.split(" on ", 1)[1].strip()
        if len(seen) > 200:
            break
    raise AssertionError("chromium did not start its DevTools server:\n" + "".join(seen[-20:]))
