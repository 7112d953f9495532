"""The chat page in headless Chromium: sign in, chat, stream, reload, tools, no outside request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import threading
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.http.routers.web import CONTENT_SECURITY_POLICY
from agentscope_serverless.schemas.agent_schemas import (
    DataContent,
    FunctionCall,
    FunctionCallOutput,
    ImageContent,
    Message,
    MessageType,
    RefusalContent,
    Role,
    TextContent,
)
from agentscope_serverless.settings import load_settings
from tests.support.browser import Page, chromium_page, running_chromium
from tests.support.http import Keys, bearer, running

pytestmark = pytest.mark.timeout(180)

# Set by a test to let the tool agent's "hold on" run finish.
HELD_RUN_GOES_ON = threading.Event()
REASONING_SEEN = threading.Event()  # the test saw the reasoning while it streamed
REFUSAL_SEEN = threading.Event()  # the test saw the refusal while it streamed
# A model's refusal as the LLM agent streams it (agents/llm.py): in pieces.
REFUSAL = ("I am ", "sorry, ", "I cannot ", "help with that.")

ENTER = ("Enter", "Enter", 13)
LONG_REASONING_PIECES = 20_000

# The chat's messages, as their text.
MESSAGE_TEXTS = (
    "[...document.querySelectorAll('#messages .message .body')].map((b) => b.textContent)"
)
HELD_RUN_STREAMING = (
    "document.querySelector('.message.assistant.streaming')"
    "?.textContent.includes('Before the break')"
)
# Counts the DOM updates of assistant replies while they stream (before they complete).
WATCH_STREAMING = """
window.streamedUpdates = 0;
new MutationObserver((records) => {
  for (const record of records) {
    const node = record.target.nodeType === 3 ? record.target.parentElement : record.target;
    if (node && node.closest(".message.assistant.streaming")) window.streamedUpdates += 1;
  }
}).observe(
  document.getElementById("messages"), {subtree: true, childList: true, characterData: true}
);
true
"""


@pytest.fixture(scope="module", autouse=True)
def chromium() -> Iterator[None]:
    """One browser for the module; each test's page has a browser context of its own."""
    with running_chromium():
        yield


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.make()


@pytest.fixture(scope="module")
def demo_url(keys: Keys) -> Iterator[str]:
    settings = load_settings(web_ui=True)
    with running(create_app(settings=settings, agent_app=demo_app, key_store=keys.store)) as url:
        yield url


def _under_root_path(app: ASGIApp, root: str) -> ASGIApp:
    """``app`` served with the root path ``root``, its requests' paths as sent (a proxy
    passing ``/agents/demo/...`` on as it is, as API Gateway does)."""

    async def served(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = {**scope, "root_path": root}
        await app(scope, receive, send)

    return served


def test_the_root_paths_own_url_redirects_to_the_page_on_the_same_origin(keys: Keys) -> None:
    """Under a root path (``uvicorn --root-path /agents/demo``) its own URL, without the
    trailing slash, redirects to the page (it was a 404); the ``Location`` is a path built
    from the root path, which names no other host whatever the root path holds."""
    app = create_app(settings=load_settings(web_ui=True), agent_app=demo_app, key_store=keys.store)
    for root, sent, location in [
        ("/agents/demo", "/agents/demo", "/agents/demo/"),
        ("//evil.example", "//evil.example", "/evil.example/"),
        ("/\\evil.example", "/%5Cevil.example", "/%5Cevil.example/"),
    ]:
        with running(_under_root_path(app, root)) as url:
            bare = httpx.get(f"{url}{sent}", headers={"host": "evil.example"})
            assert bare.status_code == 307, (root, bare.text)
            assert bare.headers["location"] == location
            query = httpx.get(f"{url}{sent}", params={"session": "s1"})
            assert query.headers["location"] == f"{location}?session=s1"
            assert httpx.post(f"{url}{sent}").status_code == 404
    with running(_under_root_path(app, "/agents/demo")) as url:
        page = httpx.get(f"{url}/agents/demo/")
        assert page.status_code == 200
        assert "text/html" in page.headers["content-type"]


async def visible(page: Page, element_id: str) -> Any:
    return await page.wait_for(
        f"document.readyState === 'complete' && document.getElementById({element_id!r})"
        f" && !document.getElementById({element_id!r}).hidden"
    )


async def sign_in(page: Page, url: str, key: str) -> None:
    """Open the page and sign in with the keyboard only (the key field has the focus)."""
    await page.send("Page.navigate", url=f"{url}/")
    await page.wait_for("document.activeElement && document.activeElement.id === 'api-key'")
    await page.type_text(key)
    await page.press(*ENTER)
    await visible(page, "chat")
    await page.wait_for("document.activeElement.id === 'composer-input'")


async def test_a_key_copied_with_invisible_characters_or_quotes_signs_in(
    demo_url: str, keys: Keys
) -> None:
    # The browser refused the header, and the page said it could not reach the server.
    submit = "; document.getElementById('sign-in-form').requestSubmit()"
    async with chromium_page() as page:
        await page.send("Page.navigate", url=f"{demo_url}/")
        await page.wait_for("document.activeElement && document.activeElement.id === 'api-key'")
        await page.evaluate(
            "document.getElementById('api-key').value = 'ask_\\u00e9t\\u00e9'" + submit
        )
        await page.wait_for(
            "document.getElementById('sign-in-error').textContent"
            " === 'That key was not accepted: it holds characters no key has.'"
        )
        copied = json.dumps(f"\u201c{keys.alice}\u200b\u201d ")
        await page.evaluate(f"document.getElementById('api-key').value = {copied}" + submit)
        await visible(page, "chat")


async def test_a_key_the_server_does_not_know_is_said_to_be_perhaps_a_restarted_servers(
    demo_url: str, keys: Keys
) -> None:
    restarted = "A development key lasts as long as the server that printed it"
    async with chromium_page() as page:
        await page.send("Page.navigate", url=f"{demo_url}/")
        await page.wait_for("document.activeElement && document.activeElement.id === 'api-key'")
        await page.type_text("ask_0123456789abcdef_" + "A" * 43)  # a key of its form
        await page.press(*ENTER)
        await page.wait_for(
            f"document.getElementById('sign-in-error').textContent.includes({restarted!r})"
        )
        # Signed in, then the key is forgotten (the server restarted): the next call says so.
        forgotten = (await keys.store.create_key(kind="user", user_id="restarted")).key
        await page.evaluate("document.getElementById('api-key').value = ''")
        await sign_in(page, demo_url, forgotten)
        await keys.store.revoke_key(forgotten.split("_")[1])
        await page.evaluate("document.getElementById('new-chat').click()")
        await page.type_text("hello")
        await page.press(*ENTER)
        await visible(page, "sign-in")
        error = await page.evaluate("document.getElementById('sign-in-error').textContent")
        assert error.startswith("Your key was not accepted. ") and restarted in error
        # Whoever signs in next finds nothing of theirs: the message was put back in the box.
        await page.type_text(keys.alice)
        await page.press(*ENTER)
        await visible(page, "chat")
        assert await page.evaluate("document.getElementById('composer-input').value") == ""
        assert not page.exceptions, page.exceptions


async def say(page: Page, text: str) -> str:
    """Type a message, send it with Enter, wait for the run to end; the last reply's text."""
    replies = await page.evaluate("document.querySelectorAll('.message.assistant').length")
    await page.evaluate("document.getElementById('composer-input').focus()")
    await page.type_text(text)
    await page.press(*ENTER)
    await page.wait_for(
        f"document.querySelectorAll('.message.assistant').length > {replies}"
        " && !document.getElementById('send').hidden"
    )
    reply: str = await page.evaluate(
        "[...document.querySelectorAll('.message.assistant .body')].at(-1).textContent"
    )
    # The reply is done: no message is left busy (screen readers would never read it).
    assert await page.evaluate("document.querySelectorAll('[aria-busy]').length") == 0
    return reply


async def reopen_session(page: Page, shown: str) -> None:
    """Reload the page and open its first session, until ``shown`` finds an element."""
    await page.send("Page.reload")
    await page.wait_for("document.querySelector('#sessions button') !== null")
    await page.evaluate("document.querySelector('#sessions button').click()")
    await page.wait_for(f"{shown} !== null")


async def send_held_run(page: Page) -> None:
    """Send the message whose run holds mid-reply (until ``HELD_RUN_GOES_ON``), and wait
    for its reply to stream up to there."""
    await page.type_text("hold on")
    await page.press(*ENTER)
    await page.wait_for(HELD_RUN_STREAMING)


def only_local(requests: list[str], url: str) -> list[str]:
    """The requests that left the server (data: URIs stay in the page)."""
    return [r for r in requests if not (r.startswith(f"{url}/") or r.startswith("data:"))]


def test_the_page_needs_no_key_and_is_locked_down(demo_url: str) -> None:
    page = httpx.get(f"{demo_url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in page.text and "style=" not in page.text and "http" not in page.text
    for asset in ("web/app.js", "web/markdown.js", "web/app.css"):
        assert httpx.get(f"{demo_url}/{asset}").status_code == 200
    assert httpx.get(f"{demo_url}/web/../settings.py").status_code == 404
    assert httpx.get(f"{demo_url}/sessions").status_code == 401


def test_the_page_is_off_unless_enabled() -> None:
    store = Keys.make().store  # a server stops its key store when it stops
    with running(create_app(settings=load_settings(), agent_app=demo_app, key_store=store)) as url:
        assert httpx.get(f"{url}/").status_code == 404
        assert httpx.get(f"{url}/web/app.js").status_code == 404


def test_the_process_function_serves_the_page_when_enabled() -> None:
    store = Keys.make().store
    settings = load_settings(web_ui=True)
    function = create_app(["process"], settings=settings, agent_app=demo_app, key_store=store)
    with running(function) as url:
        assert httpx.get(f"{url}/").headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert httpx.get(f"{url}/sessions").status_code == 404  # the page then chats only


async def test_chat_stream_reload_and_reopen_a_session(demo_url: str, keys: Keys) -> None:
    async with chromium_page() as page:
        await page.send("Page.navigate", url=f"{demo_url}/")
        await page.wait_for("document.activeElement && document.activeElement.id === 'api-key'")
        await page.type_text("ask_wrong_key")
        sign_in_shot = await page.screenshot("chat-sign-in.png")
        print(f"\nscreenshot of the sign-in form: {sign_in_shot}")
        await page.press(*ENTER)
        await page.wait_for(
            "document.getElementById('sign-in-error').textContent.includes('not accepted')"
        )
        await page.evaluate("document.getElementById('api-key').value = ''")

        await sign_in(page, demo_url, keys.alice)
        assert await page.evaluate("sessionStorage.length") == 1
        assert await page.evaluate("localStorage.length") == 0
        await page.evaluate(WATCH_STREAMING)

        first = await say(page, "My name is Alice")
        assert "Alice" in first
        assert await page.evaluate("window.streamedUpdates") > 1, "the reply arrived in one piece"
        session = await page.evaluate("document.getElementById('session-label').textContent")
        assert session.startswith("Session ")
        session_id = session.removeprefix("Session ")

        second = await say(page, "What is my name?")
        assert "Alice" in second
        memories = await page.evaluate(
            "[...document.querySelectorAll('.memories li')].map((li) => li.textContent)"
        )
        assert "My name is Alice" in memories
        await page.evaluate("document.querySelector('.memories').open = true")
        path = await page.screenshot("chat-page.png")
        print(f"\nscreenshot of the chat page: {path}")
        assert path.stat().st_size > 10_000

        await page.evaluate("window.beforeReload = true")
        await page.send("Page.reload")
        await page.wait_for("!window.beforeReload && document.readyState === 'complete'")
        await visible(page, "chat")
        listed = await page.wait_for(
            f"document.querySelector('#sessions button[data-session=\"{session_id}\"]')"
            " !== null && [...document.querySelectorAll('#sessions button')]"
            ".map((b) => b.dataset.session)"
        )
        assert session_id in listed
        # Open it with the keyboard: Tab from "New chat" reaches the first session.
        await page.evaluate("document.getElementById('new-chat').focus()")
        await page.press("Tab", "Tab", 9)
        assert await page.evaluate("document.activeElement.dataset.session") == listed[0]
        await page.press(*ENTER)
        await page.wait_for("document.querySelectorAll('#messages .message').length === 4")
        texts = await page.evaluate(MESSAGE_TEXTS)
        assert texts[0] == "My name is Alice" and texts[2] == "What is my name?"
        assert "Alice" in texts[3]
        reopened = await page.screenshot("chat-page-reopened.png")
        print(f"\nscreenshot of the reopened session: {reopened}")

        assert only_local(page.requests, demo_url) == []
        assert not page.exceptions, page.exceptions
        refused = [m for m in page.messages if "Content Security Policy" in m or "Refused" in m]
        assert refused == []
        assert not any(keys.alice in r for r in page.requests), "the key leaked into a URL"


def png(width: int, height: int) -> bytes:
    """A small PNG of vertical bars (a stand-in for a chart a sandbox would draw)."""
    colours = [(11, 92, 173), (245, 158, 11), (46, 160, 67), (180, 35, 24)]
    rows = b""
    for _ in range(height):
        row = b"\x00"
        for x in range(width):
            row += bytes(colours[(x * len(colours)) // width])
        rows += row

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


# A reply as models write them, and what no reply may turn into markup.
MARKDOWN = r"""## Plan

Use **bold**, *italic*, `code` and [the docs](https://example.com/docs?a=1&b=2).
A second line, 2 * 3 * 4, snake_case_name and https://example.com/x.

- one
- two with `x < y`
  1. nested
1. first
2. second

> quoted **text**

```python
print("<b>hi</b>")
```

| name | value |
|------|------:|
| a    | 1     |
| b \| c | 2 |

<script>window.injected = 1</script> <img src=x onerror="window.injected = 2">
[click](javascript:window.injected=3) [relative](/sessions) **unclosed
"""


LARGE_LOG = "".join(f"line {number:07d} of the log\n" for number in range(40_000))  # 1 MB
# A reply of thousands of lines and paragraphs, as a model lists a file or a table it read.
MANY_LINES = "".join(f"Line {number}\n" for number in range(2_000)) + "".join(
    f"\nParagraph {number}\n" for number in range(2_000)
)


def tool_turn(
    call_id: str,
    name: str,
    output: str,
    reply: str,
    *,
    arguments: str = "{}",
    plugin: bool = False,
) -> list[Message]:
    """A tool's call, its result and the reply after them, as an agent yields them.

    ``plugin`` sends them as plugin calls, as AgentScope's agents call their tools.
    """
    if plugin:
        call_type, output_type = MessageType.PLUGIN_CALL, MessageType.PLUGIN_CALL_OUTPUT
    else:
        call_type, output_type = MessageType.FUNCTION_CALL, MessageType.FUNCTION_CALL_OUTPUT
    call = FunctionCall(call_id=call_id, name=name, arguments=arguments)
    result = FunctionCallOutput(call_id=call_id, output=output)
    return [
        Message(type=call_type, role=Role.ASSISTANT, content=[DataContent(data=call.model_dump())]),
        Message(type=output_type, role=Role.TOOL, content=[DataContent(data=result.model_dump())]),
        Message(role=Role.ASSISTANT, content=reply),
    ]


def tool_app() -> AgentApp:
    """An agent that calls a sandbox-like tool whose result holds text and an image."""
    app = AgentApp(app_name="tools")

    @app.query(framework="text")
    async def query(self: Any, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        if msgs[-1].get_text_content() == "take your time":
            yield "Working on it"
            await asyncio.sleep(120)
            yield " and done."
            return
        if msgs[-1].get_text_content() == "in large pieces":
            for index in range(400):  # 20 s of ten paragraphs now and then
                yield f"Piece {index}.\n\n" + "A paragraph of a large piece.\n\n" * 10
                await asyncio.sleep(0.05)
            return
        if msgs[-1].get_text_content() == "a long reply in small pieces":
            for _ in range(10_000):  # 100 KB, as a model streams it: a few characters at a time
                yield "abcdefghi "
            return
        if msgs[-1].get_text_content() == "think first":
            thinking = Message(type=MessageType.REASONING, role=Role.ASSISTANT)
            yield thinking.in_progress()
            for piece in ("The user wants ", "a **short** answer."):
                yield TextContent(text=piece, delta=True)
                await asyncio.sleep(0.05)
            await asyncio.to_thread(REASONING_SEEN.wait, 60)  # however slow the page polls
            yield thinking.completed()
            yield "Short answer."
            return
        if msgs[-1].get_text_content() == "think at length":
            thinking = Message(type=MessageType.REASONING, role=Role.ASSISTANT)
            yield thinking.in_progress()
            for _ in range(LONG_REASONING_PIECES):  # as a thinking model streams it
                yield TextContent(text="abcdefgh ", delta=True)
            await asyncio.to_thread(REASONING_SEEN.wait, 60)
            yield thinking.completed()
            yield "Done thinking."
            return
        if msgs[-1].get_text_content() in ("refuse", "refuse, then wait"):
            refusal = Message(role=Role.ASSISTANT)
            yield refusal.in_progress()
            for piece in REFUSAL:
                yield refusal.add_delta_content(RefusalContent(refusal=piece, delta=True))
                await asyncio.sleep(0.05)
            if msgs[-1].get_text_content() == "refuse, then wait":
                await asyncio.sleep(120)  # until stopped
            await asyncio.to_thread(REFUSAL_SEEN.wait, 60)  # however slow the page polls
            yield refusal.completed()
            return
        if msgs[-1].get_text_content() == "in many lines":
            lines = MANY_LINES.splitlines(keepends=True)
            for start in range(0, len(lines), 200):  # shown while it streams, as it grows
                yield "".join(lines[start : start + 200])
                await asyncio.sleep(0.05)
            return
        if msgs[-1].get_text_content() == "in markdown":
            for start in range(0, len(MARKDOWN), 7):  # as a model streams it
                yield MARKDOWN[start : start + 7]
            return
        if msgs[-1].get_text_content() == "in two scripts":
            yield "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd.\n\nHello, world."
            return
        if msgs[-1].get_text_content() == "say nothing":
            for piece in (" ", "\n\n", "  "):
                yield piece
            return
        if msgs[-1].get_text_content() == "fail":
            yield "Let me see"
            raise RuntimeError("the weather service is down")
        if msgs[-1].get_text_content() == "fail with a link":
            raise RuntimeError("see https://status.example.com/x for **why**")
        if msgs[-1].get_text_content() == "hold on":
            yield "Before the break"
            await asyncio.to_thread(HELD_RUN_GOES_ON.wait, 60)
            yield " and after it."
            return
        if msgs[-1].get_text_content() == "images from elsewhere":
            chart = "data:image/png;base64," + __import__("base64").b64encode(png(8, 8)).decode()
            urls = [
                "//elsewhere.example/a.png",
                "/\\elsewhere.example/b.png",
                "https://elsewhere.example/c.png",
                "javascript:alert(1)",
                chart,
            ]
            yield Message(role=Role.ASSISTANT, content=[ImageContent(image_url=u) for u in urls])
            return
        if msgs[-1].get_text_content() == "a large tool result":
            for message in tool_turn("call_4", "read_log", LARGE_LOG, "The log is read."):
                yield message
            return
        if msgs[-1].get_text_content() == "a plugin":
            # As AgentScope's agents call their tools.
            for message in tool_turn(
                "call_3", "get_weather", '"sunny"', "It is sunny.", plugin=True
            ):
                yield message
            return
        if msgs[-1].get_text_content() == "a tool with a deeply nested result":
            for message in tool_turn("call_4", "scrape", DEEP_RESULT, "The page is scraped."):
                yield message
            return
        if msgs[-1].get_text_content() == "a tool with a malformed result":
            # Tools return anything: an MCP-like result with parts that are not objects.
            malformed = {"content": [None, 7, {"type": "text", "text": "page scraped"}]}
            for message in tool_turn(
                "call_2", "scrape", json.dumps(malformed), "The page is scraped."
            ):
                yield message
            return
        yield "Let me draw that. "
        image = {"type": "image", "data": __import__("base64").b64encode(png(240, 90)).decode()}
        output = {
            "content": [
                {"type": "text", "text": "<Figure size 240x90>"},
                {**image, "mimeType": "image/png"},
            ],
            "isError": False,
        }
        for message in tool_turn(
            "call_1",
            "run_ipython_cell",
            json.dumps(output),
            "Here is the chart of sales by quarter.",
            arguments='{"code": "plot(sales)"}',
        ):
            yield message

    return app


@pytest.fixture
def tool_server() -> Iterator[tuple[str, str]]:
    """The tool agent's server and a key for it."""
    keys = Keys.make()  # a server stops its key store when it stops
    settings = load_settings(web_ui=True)
    with running(create_app(settings=settings, agent_app=tool_app(), key_store=keys.store)) as url:
        yield url, keys.bob


async def test_tool_calls_and_images_are_shown(tool_server: tuple[str, str]) -> None:
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await say(page, "<img src=x onerror=alert(1)> plot the sales")
        await page.wait_for("document.querySelectorAll('.message.tool').length === 2")
        call = await page.evaluate("document.querySelector('.message.tool summary').textContent")
        assert call == "Calls run_ipython_cell"
        result = await page.evaluate(
            "document.querySelectorAll('.message.tool summary')[1].textContent"
        )
        assert result == "Result of run_ipython_cell"
        image = await page.wait_for(
            "(() => { const i = document.querySelector('.message.tool img');"
            " return i && i.complete && i.naturalWidth; })()"
        )
        assert image == 240
        # The user's text is text, never markup.
        assert await page.evaluate("document.querySelectorAll('.message.user img').length") == 0
        path = await page.screenshot("chat-page-tools.png")
        print(f"\nscreenshot of tool calls on the chat page: {path}")
        assert only_local(page.requests, url) == []
        assert not page.exceptions, page.exceptions


async def test_a_plugins_call_and_result_are_shown_as_a_tools(
    tool_server: tuple[str, str],
) -> None:
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await say(page, "a plugin")
        await page.wait_for("document.querySelectorAll('.message.tool').length === 2")
        summaries = await page.evaluate(
            "[...document.querySelectorAll('.message.tool summary')].map(s => s.textContent)"
        )
        assert summaries == ["Calls get_weather", "Result of get_weather"]
        assert not page.exceptions, page.exceptions


async def start_a_long_run(page: Page) -> None:
    """Send the tool agent's slow request; return once its reply streams."""
    await page.type_text("take your time")
    await page.press(*ENTER)
    await page.wait_for(
        "document.querySelector('.message.assistant.streaming')"
        " && document.querySelector('.message.assistant').textContent.includes('Working')"
    )


async def test_a_run_is_stopped_with_the_keyboard(tool_server: tuple[str, str]) -> None:
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await start_a_long_run(page)
        # Focus stays in the message box: typing on must not reach Stop (it went there, and
        # the next key pressed stopped the run).
        assert await page.evaluate("document.activeElement.id") == "composer-input"
        await page.type_text("so what")
        await page.press(*ENTER)  # a second Enter while it runs: nothing is sent, nothing stops
        assert await page.evaluate("document.getElementById('composer-input').value") == "so what"
        assert await page.evaluate("document.querySelectorAll('.message.user').length") == 1
        assert not await page.evaluate("document.getElementById('stop').hidden")
        # Screen readers wait for the message to be done rather than reading it at each piece.
        busy = "document.querySelector('.message.assistant').getAttribute('aria-busy')"
        assert await page.evaluate(busy) == "true"
        await page.press("Escape", "Escape", 27)
        await page.wait_for("document.getElementById('run-status').textContent === 'Stopped.'")
        assert await page.evaluate(busy) is None
        assert await page.evaluate("document.getElementById('stop').hidden")
        assert await page.evaluate("document.activeElement.id") == "composer-input"

        # The server is told too (a server without the runs routes answers 404: no error).
        async def cancel_sent() -> bool:
            return any(r.startswith(f"{url}/runs/") for r in page.requests)

        await eventually(cancel_sent)
        cancel = [r for r in page.requests if r.startswith(f"{url}/runs/")]
        assert len(cancel) == 1 and cancel[0].endswith("/cancel")
        assert not page.exceptions, page.exceptions
        reply = await page.evaluate("document.querySelector('.message.assistant').textContent")
        assert "done" not in reply
    # The run stopped on the server (the page never reads the cancel's answer: a no-store one
    # then leaves Chrome no resource timing entry of it to wait for).
    run_path = cancel[0].removeprefix(url).removesuffix("/cancel")
    async with httpx.AsyncClient(base_url=url, headers=bearer(key), timeout=10) as client:

        async def canceled() -> bool:
            return bool((await client.get(run_path)).json()["status"] == "canceled")

        await eventually(canceled)


@pytest.mark.parametrize("then_left", [False, True], ids=["stopped", "stopped-then-left"])
async def test_a_run_stopped_before_its_reply_starts_is_canceled(
    tool_server: tuple[str, str], then_left: bool
) -> None:
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        # The reply's headers (which name the run) reach the page 2 s after the server sent
        # them, as on a slow network: Stop is pressed before the page knows the run.
        await page.evaluate(
            "(() => { const send = window.fetch;"
            " window.fetch = (input, init) => { const reply = send(input, init);"
            " if (String(input) !== 'process') return reply;"
            " window.processSent = true;"
            " return reply.then((r) => new Promise((done) => setTimeout(() => done(r), 2000)));"
            " }; })()"
        )
        await page.type_text("take your time")
        await page.press(*ENTER)
        await page.wait_for("window.processSent === true")
        await page.evaluate("document.getElementById('stop').click()")
        if then_left:
            # Leaving then is no reason not to cancel the run it stopped.
            await page.evaluate("document.getElementById('new-chat').click()")

            async def cancel_sent() -> bool:
                return any(r.endswith("/cancel") for r in page.requests)

            await eventually(cancel_sent)
        else:
            await page.wait_for("document.getElementById('run-status').textContent === 'Stopped.'")
        cancel = [r for r in page.requests if r.startswith(f"{url}/runs/")]
        assert len(cancel) == 1 and cancel[0].endswith("/cancel")
        assert not page.exceptions, page.exceptions
    # The run stopped on the server, where it would have gone on for two minutes.
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as client:
        (session,) = (await client.get("/sessions")).json()["items"]
        for _ in range(100):
            runs = await client.get("/runs", params={"session_id": session["id"]})
            (run,) = runs.json()["items"]
            if run["status"] != "in_progress":
                break
            await asyncio.sleep(0.05)
        assert run["status"] == "canceled"


async def test_a_message_stopped_before_it_was_sent_goes_back_to_the_box(
    tool_server: tuple[str, str],
) -> None:
    # It stayed on screen as if sent, and its text was gone from the box.
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.type_text("take your time")
        await page.evaluate(
            "document.getElementById('composer').requestSubmit();"
            " document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}))"
        )
        await page.wait_for(
            "document.getElementById('run-status').textContent === 'Stopped before it was sent.'"
        )
        assert await page.evaluate("document.querySelectorAll('.message.user').length") == 0
        box = "document.getElementById('composer-input').value"
        assert await page.evaluate(box) == "take your time"
        assert not [r for r in page.requests if r == f"{url}/process"]


async def streams_in_large_pieces(page: Page, url: str, key: str) -> None:
    """A conversation taller than the window, then a reply of large pieces, followed."""
    await sign_in(page, url, key)
    for _ in range(6):
        await say(page, "in markdown")
    await page.type_text("in large pieces")
    await page.press(*ENTER)
    await page.wait_for("document.querySelector('.message.assistant.streaming') !== null")
    await asyncio.sleep(0.3)


async def read_back_to_the_start(page: Page) -> None:
    """The reader turns the wheel back over the whole conversation."""
    box = await page.evaluate(
        "(() => { const r = document.getElementById('messages').getBoundingClientRect();"
        " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
    )
    for _ in range(20):
        await page.send(
            "Input.dispatchMouseEvent",
            type="mouseWheel",
            x=box[0],
            y=box[1],
            deltaX=0,
            deltaY=-2000,
        )
    await page.wait_for("document.getElementById('messages').scrollTop === 0")


STREAMING = "document.querySelector('.message.assistant.streaming') !== null"
FROM_THE_END = (
    "(() => { const log = document.getElementById('messages');"
    " return log.scrollHeight - log.scrollTop - log.clientHeight; })()"
)


async def test_a_reader_scrolled_up_stays_there_while_a_reply_streams(
    tool_server: tuple[str, str],
) -> None:
    # Every piece of the reply scrolled the conversation back to its end; then a reader who
    # turned the wheel back less than 48 px was taken back to the end with the next piece.
    url, key = tool_server
    async with chromium_page() as page:
        await streams_in_large_pieces(page, url, key)
        # The reader turns the wheel back a little, to reread the last lines: its event, then
        # its scroll, 40 px up from the end.
        top = await page.evaluate(
            "(() => { const log = document.getElementById('messages');"
            " log.dispatchEvent(new WheelEvent('wheel', {deltaY: -40, bubbles: true}));"
            " log.scrollTop = log.scrollHeight - log.clientHeight - 40;"
            " return log.scrollTop; })()"
        )
        await asyncio.sleep(1)  # large pieces keep coming
        assert await page.evaluate(STREAMING)
        assert await page.evaluate("document.getElementById('messages').scrollTop") == top
        assert await page.evaluate(FROM_THE_END) > 1000
        # And on, back over the whole conversation.
        await read_back_to_the_start(page)
        await asyncio.sleep(1.5)  # pieces keep coming
        assert await page.evaluate(STREAMING)
        assert await page.evaluate("document.getElementById('messages').scrollTop") == 0
        await page.press("Escape", "Escape", 27)


# A loaded machine: the reader's scroll is handled by the page only once a large piece of the
# reply (2000 px) is on screen below it.
GROWS_BEFORE_THE_SCROLL_IS_HANDLED = """
window.addEventListener("scroll", () => {
  const piece = document.createElement("li");
  piece.style.height = "2000px";
  piece.style.flex = "none";
  document.getElementById("messages").append(piece);
}, {capture: true, once: true});
"""


async def test_a_reader_back_at_the_end_is_followed_again_however_much_came_meanwhile(
    tool_server: tuple[str, str],
) -> None:
    # The page judged the reader back at the end by their distance from it as it was when
    # it handled their scroll: 48 px of reply or more come meanwhile, and it followed no more.
    url, key = tool_server
    async with chromium_page() as page:
        await streams_in_large_pieces(page, url, key)
        await read_back_to_the_start(page)
        await page.evaluate(GROWS_BEFORE_THE_SCROLL_IS_HANDLED)
        back = await page.evaluate(
            "(() => { const log = document.getElementById('messages');"
            " log.scrollTop = log.scrollHeight; return log.scrollTop; })()"
        )
        await page.wait_for(
            f"document.getElementById('messages').scrollTop > {back} + 2000", within=10
        )
        assert await page.evaluate(STREAMING)
        await page.press("Escape", "Escape", 27)


async def test_a_malformed_tool_result_is_shown_and_the_run_goes_on(
    tool_server: tuple[str, str],
) -> None:
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        reply = await say(page, "a tool with a malformed result")
        assert reply == "The page is scraped."
        assert await page.evaluate("document.getElementById('run-status').textContent") == "Done."
        result = await page.evaluate(
            "[...document.querySelectorAll('.message.tool pre')].map((pre) => pre.textContent)"
        )
        assert result == ["{}", "null", "7", "page scraped"]
        # Reopening the session shows the same.
        session = await page.evaluate("document.getElementById('session-label').textContent")
        current = "document.querySelector('#sessions button[aria-current=\"true\"]')"
        await page.wait_for(f"{current} !== null")
        await page.evaluate(f"{current}.click()")
        await page.wait_for("document.getElementById('run-status').textContent === ''")
        label = await page.evaluate("document.getElementById('session-label').textContent")
        assert label == session
        reopened = await page.evaluate(
            "[...document.querySelectorAll('#messages .message .body')].map((b) => b.textContent)"
        )
        assert reopened[-1] == "The page is scraped." and "page scraped" in reopened[-2]
        assert not page.exceptions, page.exceptions


# A tool's output nested deeper than the page's stack writes it back (JSON.stringify).
DEEP_RESULT = '{"content": [' + "[" * 20_000 + "]" * 20_000 + "]}"


async def test_a_tool_result_nested_too_deeply_to_indent_is_shown_as_it_came(
    tool_server: tuple[str, str],
) -> None:
    # Writing it indented overflowed the stack: the result was shown empty while streamed,
    # and the session could not be opened again ("Maximum call stack size exceeded").
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        assert await say(page, "a tool with a deeply nested result") == "The page is scraped."
        shown = "[...document.querySelectorAll('.message.tool pre')].map((pre) => pre.textContent)"
        assert await page.evaluate(shown) == ["{}", DEEP_RESULT]
        current = "document.querySelector('#sessions button[aria-current=\"true\"]')"
        await page.wait_for(f"{current} !== null")
        await page.evaluate(f"{current}.click()")
        await page.wait_for("document.getElementById('run-status').textContent === ''")
        reopened = await page.evaluate(
            "[...document.querySelectorAll('#messages .message .body')].map((b) => b.textContent)"
        )
        assert reopened[-1] == "The page is scraped."
        assert await page.evaluate(shown) == ["{}", DEEP_RESULT]
        assert not page.exceptions, page.exceptions


async def test_images_from_other_hosts_are_not_loaded(tool_server: tuple[str, str]) -> None:
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        reply = await say(page, "images from elsewhere")
        images = await page.evaluate(
            "[...document.querySelectorAll('.message.assistant img')].map((i) => i.src)"
        )
        assert len(images) == 1 and images[0].startswith("data:image/png;base64,")
        for shown in ("//elsewhere.example/a.png", "/\\elsewhere.example/b.png", "javascript:"):
            assert f"[image: {shown}" in reply
        assert only_local(page.requests, url) == []
        refused = [m for m in page.messages if "Content Security Policy" in m]
        assert refused == []
        assert not page.exceptions, page.exceptions


async def test_long_unbroken_words_do_not_widen_the_page(demo_url: str, keys: Keys) -> None:
    word = "w" * 3000
    session = "s" * 400
    async with httpx.AsyncClient() as client:
        created = await client.post(
            f"{demo_url}/sessions",
            headers={"Authorization": f"Bearer {keys.bob}"},
            json={"session_id": session},
        )
    assert created.status_code == 201
    async with chromium_page() as page:
        await sign_in(page, demo_url, keys.bob)
        button = f"document.querySelector('#sessions button[data-session={session}]')"
        await page.wait_for(f"{button} !== null")
        await page.evaluate(f"{button}.click()")
        await page.wait_for(
            f"document.activeElement.id === 'composer-input' && {button}.ariaCurrent"
        )
        await say(page, word)
        await say(page, word)  # the first message comes back as a memory of this one
        await page.wait_for("document.querySelector('.memories li') !== null")
        await page.evaluate("document.querySelector('.memories').open = true")
        path = await page.screenshot("chat-page-long-words.png")
        print(f"\nscreenshot of long words: {path}")
        widths = await page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth,"
            " document.getElementById('messages').scrollWidth,"
            " document.getElementById('messages').clientWidth]"
        )
        assert widths[0] == widths[1] and widths[2] == widths[3], widths
        assert not page.exceptions, page.exceptions


async def test_the_sessions_list_comes_back_by_itself_after_an_outage(
    demo_url: str, keys: Keys
) -> None:
    # A list the server could not give stayed in error until the page was reloaded.
    session = f"after-outage-{uuid.uuid4().hex[:8]}"
    body = {"input": [{"role": "user", "content": "hello"}], "session_id": session}
    async with httpx.AsyncClient(headers=bearer(keys.bob), timeout=30) as client:
        assert (await client.post(f"{demo_url}/process", json=body)).status_code == 200
    async with chromium_page() as page:
        await page.send("Network.setBlockedURLs", urls=["*/sessions?limit=1000*"])
        await sign_in(page, demo_url, keys.bob)
        await page.wait_for(
            "document.getElementById('sessions-status').textContent"
            " === 'Cannot reach the server. Trying again…'"
        )
        await asyncio.sleep(2.5)  # a retry or more, failing too
        assert await page.evaluate("document.querySelector('#sessions button')") is None
        await page.send("Network.setBlockedURLs", urls=[])
        await page.wait_for(
            f"document.querySelector('[data-session=\"{session}\"]') !== null"
            " && document.getElementById('sessions-status').textContent === ''",
            within=15,
        )
        assert not page.exceptions, page.exceptions


async def test_a_session_left_while_loading_does_not_spill_into_the_next(
    tool_server: tuple[str, str],
) -> None:
    url, key = tool_server
    headers = {"Authorization": f"Bearer {key}"}
    long = [{"role": "user", "content": f"long {i}"} for i in range(2500)]  # pages of 1,000
    async with httpx.AsyncClient(headers=headers, timeout=60) as client:
        for start in range(0, len(long), 500):
            messages = {"messages": long[start : start + 500]}
            answer = await client.post(f"{url}/sessions/long/messages", json=messages)
            assert answer.status_code == 201
        short = {"messages": [{"role": "user", "content": "short"}]}
        assert (await client.post(f"{url}/sessions/short/messages", json=short)).status_code == 201
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.wait_for("document.querySelectorAll('#sessions button').length === 2")
        await page.evaluate("document.querySelector('[data-session=long]').click()")

        async def loading() -> bool:
            return any("/sessions/long/messages?limit=1000" in r for r in page.requests)

        await eventually(loading)
        await page.evaluate("document.querySelector('[data-session=short]').click()")
        await page.wait_for(
            "document.getElementById('run-status').textContent === ''"
            " && document.querySelector('#messages .message .body')?.textContent === 'short'"
        )
        await say(page, "take a picture")  # while the page would go on loading the long one
        texts = await page.evaluate(
            "[...document.querySelectorAll('#messages .message.user .body')]"
            ".map((b) => b.textContent)"
        )
        assert texts == ["short", "take a picture"]
        assert not page.exceptions, page.exceptions


# Counts the messages of a session's history ("message N") put in the conversation.
WATCH_BUILT = """
window.builtFromHistory = 0;
new MutationObserver((records) => {
  for (const record of records) {
    for (const node of record.addedNodes) {
      if (node.textContent.startsWith("Youmessage ")) window.builtFromHistory += 1;
    }
  }
}).observe(document.getElementById("messages"), {childList: true});
true
"""


async def test_a_long_session_opens_with_its_newest_messages(
    tool_server: tuple[str, str],
) -> None:
    url, key = tool_server
    messages = [{"role": "user", "content": f"message {i}"} for i in range(2500)]
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        for start in range(0, len(messages), 500):
            answer = await client.post(
                f"{url}/sessions/long/messages", json={"messages": messages[start : start + 500]}
            )
            assert answer.status_code == 201
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.wait_for("document.querySelector('[data-session=long]') !== null")
        await page.evaluate(WATCH_BUILT)
        # A message sent while the session loads goes once its history is on screen, at the
        # end: it landed in the middle of the history, or was trimmed away with the oldest.
        await page.evaluate(
            "document.querySelector('[data-session=long]').click();"
            " document.getElementById('composer-input').value = 'take a picture';"
            " document.getElementById('composer').requestSubmit()"
        )
        await page.wait_for(
            "document.querySelectorAll('.message.assistant').length > 0"
            " && !document.getElementById('send').hidden"
        )
        texts = await page.evaluate(MESSAGE_TEXTS)
        # The newest 2,000 are shown, the page saying how many earlier ones are not; then the
        # message sent while they loaded, and its reply.
        mine = texts.index("take a picture")
        assert mine == 2000 and texts[0] == "message 500" and texts[mine - 1] == "message 2499"
        assert "chart" in texts[-1]
        note = await page.evaluate("document.querySelector('#messages .hidden-note').textContent")
        assert note == "500 earlier messages are not shown."
        # The 500 earlier ones were built too, then taken away (20,000 messages took 8 s).
        assert await page.evaluate("window.builtFromHistory") == 2000
        assert not page.exceptions, page.exceptions


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 30) -> None:
    """Wait until ``check()`` is true; fail after ``within`` seconds."""
    async with asyncio.timeout(within):
        while True:
            if await check():
                return
            await asyncio.sleep(0.05)


async def stored(client: httpx.AsyncClient, runs: str) -> bool:
    return bool((await client.get(runs)).json()["items"])


async def resumed(requests: list[str]) -> bool:
    return any("/events?after=" in request for request in requests)


@contextlib.asynccontextmanager
async def let_the_held_run_end() -> AsyncIterator[None]:
    """Whatever happens, the agent's "hold on" run ends with the test (so the server stops)."""
    try:
        yield
    finally:
        HELD_RUN_GOES_ON.set()


class Relay:
    """A TCP relay in front of a server that can cut every open connection, as a network can."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.sockets: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self.server is not None
        self.server.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        self.sockets += [writer, upstream_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
            sink.close()

        await asyncio.gather(
            pipe(reader, upstream_writer), pipe(upstream_reader, writer), return_exceptions=True
        )

    def cut(self) -> None:
        for writer in self.sockets:
            writer.transport.abort()
        self.sockets.clear()


async def test_a_dropped_stream_is_picked_up_where_it_broke_off(
    tool_server: tuple[str, str],
) -> None:
    server, key = tool_server
    HELD_RUN_GOES_ON.clear()
    relay = Relay(server)
    async with relay as url, chromium_page() as page, let_the_held_run_end():
        await sign_in(page, url, key)
        await send_held_run(page)
        label = await page.evaluate("document.getElementById('session-label').textContent")
        runs = f"{server}/runs?session_id={label.removeprefix('Session ')}"
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as client:
            await eventually(lambda: stored(client, runs))  # the run's first write
        relay.cut()
        # The page asks for the run's events after the last one it had.
        await eventually(lambda: resumed(page.requests))
        HELD_RUN_GOES_ON.set()
        await page.wait_for("!document.getElementById('send').hidden")
        replies = await page.evaluate(
            "[...document.querySelectorAll('.message.assistant .body')].map((b) => b.textContent)"
        )
        assert replies == ["Before the break and after it."]
        assert await page.evaluate("document.getElementById('run-status').textContent") == "Done."
        assert not page.exceptions, page.exceptions


class Busy:
    """A server whose first answers to a run's events are errors a busy server gives for a
    moment: a store that did not answer (503), a function throttled (429)."""

    def __init__(self, app: ASGIApp, statuses: list[int]) -> None:
        self.app = app
        self.statuses = statuses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/events") and self.statuses:
            status = self.statuses.pop(0)
            error = {"error": {"code": "BUSY", "message": f"busy for a moment ({status})"}}
            body = json.dumps(error).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


@pytest.fixture
def busy_tool_server() -> Iterator[tuple[str, str]]:
    """The tool agent's server, its first two answers to a run's events 503 then 429, and a
    key for it."""
    keys = Keys.make()  # a server stops its key store when it stops
    settings = load_settings(web_ui=True)
    app = create_app(settings=settings, agent_app=tool_app(), key_store=keys.store)
    with running(Busy(app, [503, 429])) as url:
        yield url, keys.bob


async def test_a_dropped_stream_is_picked_up_once_the_server_is_no_longer_busy(
    busy_tool_server: tuple[str, str],
) -> None:
    # A 503 or a 429 to the first try to pick the stream up again ended it, saying "the
    # connection closed before the run ended", while the run went on.
    server, key = busy_tool_server
    HELD_RUN_GOES_ON.clear()
    relay = Relay(server)
    async with relay as url, chromium_page() as page, let_the_held_run_end():
        await sign_in(page, url, key)
        await send_held_run(page)
        label = await page.evaluate("document.getElementById('session-label').textContent")
        runs = f"{server}/runs?session_id={label.removeprefix('Session ')}"
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as client:
            await eventually(lambda: stored(client, runs))  # the run's first write
        relay.cut()
        HELD_RUN_GOES_ON.set()
        await page.wait_for("!document.getElementById('send').hidden")
        assert await page.evaluate(MESSAGE_TEXTS) == ["hold on", "Before the break and after it."]
        assert await page.evaluate("document.getElementById('run-status').textContent") == "Done."
        assert len([request for request in page.requests if "/events?after=" in request]) == 3
        assert not page.exceptions, page.exceptions


# The sequence number of the run's event a buffered Lambda function cannot return.
TOO_LARGE = 5


class BufferedFunction:
    """A server in front of which every event stream is answered as a buffered Lambda
    function answers a run holding an event too large by itself (http/lambda_handler.py,
    ``_run_stream_end``): whole, cut before that event, with an error event saying so. A
    stream resumed after the event before it holds the error event alone."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: ASGIMessage | None = None
        body: list[bytes] = []

        async def buffered(message: ASGIMessage) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message["headers"])
                if not headers.get(b"content-type", b"").startswith(b"text/event-stream"):
                    await send(message)
                    return
                start = message
            elif start is None:
                await send(message)
            else:
                body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    await send(start)
                    cut = self.cut(b"".join(body).decode())
                    await send({"type": "http.response.body", "body": cut.encode()})

        await self.app(scope, receive, buffered)

    @staticmethod
    def cut(text: str) -> str:
        kept = ""
        for event in text.split("\n\n"):
            data = [line[6:] for line in event.split("\n") if line.startswith("data: ")]
            if data and json.loads(data[0]).get("sequence_number") == TOO_LARGE:
                message = (
                    f"the stream was cut here: its next event (id {TOO_LARGE}) is 7000400 "
                    "bytes by itself, more than the 6291456 bytes a buffered Lambda function "
                    "can return, so this function cannot return it, however it is resumed"
                )
                error = {"error": {"code": "RESPONSE_TOO_LARGE", "message": message}}
                return f"{kept}event: error\ndata: {json.dumps(error)}\n\n"
            if event:
                kept += event + "\n\n"
        return text


@pytest.fixture
def buffered_function() -> Iterator[tuple[str, str]]:
    """The demo agent's server behind :class:`BufferedFunction`, and a key for it."""
    keys = Keys.make()  # a server stops its key store when it stops
    settings = load_settings(web_ui=True)
    app = create_app(settings=settings, agent_app=demo_app, key_store=keys.store)
    with running(BufferedFunction(app)) as url:
        yield url, keys.alice


async def test_a_stream_the_server_ends_with_an_error_says_it_and_stops_resuming(
    buffered_function: tuple[str, str],
) -> None:
    # The page resumed the stream every 0.5 s for ever, saying nothing of the error.
    url, key = buffered_function
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.type_text("hello")
        await page.press(*ENTER)
        await page.wait_for("!document.getElementById('send').hidden", within=10)
        status = await page.evaluate("document.getElementById('run-status').textContent")
        assert status.startswith("Error: the stream was cut here: its next event (id 5)")
        assert status.endswith("however it is resumed (RESPONSE_TOO_LARGE)")
        await asyncio.sleep(2)  # the time of a few more tries, were there any
        resumed = [request for request in page.requests if "/events?after=" in request]
        assert len(resumed) == 1  # the one answering the error alone
        reply = await page.evaluate(
            "document.querySelector('.message.assistant .body').textContent"
        )
        assert reply == "Hello! I "  # the events before the one left out
        assert not page.exceptions, page.exceptions


async def test_a_reload_during_a_run_shows_the_run_again(tool_server: tuple[str, str]) -> None:
    url, key = tool_server
    HELD_RUN_GOES_ON.clear()
    async with chromium_page() as page, let_the_held_run_end():
        await sign_in(page, url, key)
        await send_held_run(page)
        label = await page.evaluate("document.getElementById('session-label').textContent")

        await page.evaluate("window.beforeReload = true")
        await page.send("Page.reload")
        await page.wait_for("!window.beforeReload && document.readyState === 'complete'")
        await page.wait_for(HELD_RUN_STREAMING)
        assert await page.evaluate("document.getElementById('session-label').textContent") == label
        assert await page.evaluate("document.activeElement.id") == "composer-input"

        HELD_RUN_GOES_ON.set()
        await page.wait_for("!document.getElementById('send').hidden")
        texts = await page.evaluate(MESSAGE_TEXTS)
        assert texts == ["hold on", "Before the break and after it."]
        assert await page.evaluate("document.getElementById('run-status').textContent") == "Done."
        assert await page.evaluate("sessionStorage.length") == 1  # the key alone: nothing to resume
        assert not page.exceptions, page.exceptions


async def test_a_run_left_for_a_new_chat_goes_on_and_is_followed_again_from_its_session(
    tool_server: tuple[str, str],
) -> None:
    # Leaving the session (a new chat, another session) canceled the run.
    url, key = tool_server
    HELD_RUN_GOES_ON.clear()
    async with chromium_page() as page, let_the_held_run_end():
        await sign_in(page, url, key)
        await send_held_run(page)
        run_id = await page.wait_for(
            "JSON.parse(sessionStorage.getItem('agentscope-serverless.run') || '{}').id"
        )
        label = await page.evaluate("document.getElementById('session-label').textContent")
        session = label.removeprefix("Session ")

        await page.evaluate("document.getElementById('new-chat').click()")
        assert await page.evaluate("document.querySelectorAll('.message').length") == 0
        assert await page.evaluate("document.getElementById('stop').hidden")
        async with httpx.AsyncClient(base_url=url, headers=bearer(key)) as client:
            run = (await client.get(f"/runs/{run_id}")).json()
        assert run["status"] == "in_progress" and not run["cancel_requested"], run

        # Opened again, the session shows the run going on, and follows it to its end.
        button = f"document.querySelector('#sessions button[data-session={json.dumps(session)}]')"
        await page.wait_for(f"{button} !== null")
        await page.evaluate(f"{button}.click()")
        await page.wait_for(HELD_RUN_STREAMING)
        assert not await page.evaluate("document.getElementById('stop').hidden")
        # Opening a session (this one again) leaves it too, and it is followed again.
        await page.evaluate(f"{button}.click()")
        two_messages = "document.querySelectorAll('.message').length === 2"
        await page.wait_for(f"{HELD_RUN_STREAMING} && {two_messages}")
        HELD_RUN_GOES_ON.set()
        await page.wait_for("!document.getElementById('send').hidden")
        texts = await page.evaluate(MESSAGE_TEXTS)
        assert texts == ["hold on", "Before the break and after it."]
        assert await page.evaluate("document.getElementById('run-status').textContent") == "Done."
        assert not [r for r in page.requests if r.endswith("/cancel")]
        assert not page.exceptions, page.exceptions


class SlowToAnswer:
    """A server whose answers to ``/process`` start once ``answer`` is set, the run under
    way meanwhile (as behind a proxy slow to pass them on)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.answer = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/process":
            await self.app(scope, receive, send)
            return

        async def held(message: ASGIMessage) -> None:
            if message["type"] == "http.response.start":
                await asyncio.to_thread(self.answer.wait, 60)
            await send(message)

        await self.app(scope, receive, held)


@pytest.fixture
def slow_tool_server() -> Iterator[tuple[str, str, SlowToAnswer]]:
    """The tool agent's server behind :class:`SlowToAnswer`, a key for it, and the wrapper."""
    keys = Keys.make()  # a server stops its key store when it stops
    settings = load_settings(web_ui=True)
    slow = SlowToAnswer(create_app(settings=settings, agent_app=tool_app(), key_store=keys.store))
    try:
        with running(slow) as url:
            yield url, keys.bob, slow
    finally:
        slow.answer.set()


async def test_a_run_left_before_the_server_named_it_is_followed_again_with_its_message(
    slow_tool_server: tuple[str, str, SlowToAnswer],
) -> None:
    # Left before the answer named the run, the page dropped the request: the run went on,
    # and its session, opened again, showed its reply streaming under no message of the user.
    url, key, slow = slow_tool_server
    HELD_RUN_GOES_ON.clear()
    async with (
        chromium_page() as page,
        let_the_held_run_end(),
        httpx.AsyncClient(base_url=url, headers=bearer(key)) as client,
    ):
        await sign_in(page, url, key)
        await page.type_text("hold on")
        await page.press(*ENTER)

        async def started() -> bool:
            sessions = (await client.get("/sessions")).json()["items"]
            return bool(sessions) and await stored(client, f"/runs?session_id={sessions[0]['id']}")

        await eventually(started)
        session = (await client.get("/sessions")).json()["items"][0]["id"]
        await page.evaluate("document.getElementById('new-chat').click()")
        slow.answer.set()
        button = f"document.querySelector('#sessions button[data-session={json.dumps(session)}]')"
        await page.wait_for(f"{button} !== null")
        await page.evaluate(f"{button}.click()")
        await page.wait_for(HELD_RUN_STREAMING)
        HELD_RUN_GOES_ON.set()
        await page.wait_for("!document.getElementById('send').hidden")
        texts = await page.evaluate(MESSAGE_TEXTS)
        assert texts == ["hold on", "Before the break and after it."]
        assert not [r for r in page.requests if r.endswith("/cancel")]
        assert not page.exceptions, page.exceptions


async def test_a_message_stopped_then_refused_goes_back_to_the_box(
    slow_tool_server: tuple[str, str, SlowToAnswer],
) -> None:
    # Stopped while the server had not answered, then refused: the message stayed in the
    # conversation, "Stopped.", though no run had it, and the box was left empty.
    url, key, slow = slow_tool_server
    too_large = "x" * 1_100_000  # more than the server takes (413)
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.evaluate(
            f"document.getElementById('composer-input').value = {json.dumps(too_large)};"
            " document.getElementById('composer').requestSubmit()"
        )

        async def sent() -> bool:
            return any(request.endswith("/process") for request in page.requests)

        await eventually(sent)
        await page.press("Escape", "Escape", 27)
        await page.wait_for("document.getElementById('run-status').textContent === 'Stopping…'")
        slow.answer.set()
        await page.wait_for("!document.getElementById('send').hidden")
        status = await page.evaluate("document.getElementById('run-status').textContent")
        assert status.startswith("Error: ") and status.endswith("it is back in the box."), status
        assert await page.evaluate("document.getElementById('composer-input').value") == too_large
        assert await page.evaluate("document.querySelectorAll('.message').length") == 0

        # Signed out while the server had not answered: nothing goes back in the box for
        # whoever signs in next.
        slow.answer.clear()
        await page.evaluate("document.getElementById('composer').requestSubmit()")

        async def sent_again() -> bool:
            return len([r for r in page.requests if r.endswith("/process")]) == 2

        await eventually(sent_again)
        await page.evaluate("document.getElementById('sign-out').click()")
        slow.answer.set()
        await page.wait_for("!document.getElementById('send').hidden")
        await page.type_text(key)
        await page.press(*ENTER)
        await visible(page, "chat")
        assert await page.evaluate("document.getElementById('composer-input').value.length") == 0
        assert not page.exceptions, page.exceptions


async def test_a_reply_of_whitespace_alone_says_it_is_empty(tool_server: tuple[str, str]) -> None:
    # It showed as an empty bubble.
    url, key = tool_server
    note = (
        "getComputedStyle([...document.querySelectorAll('.message.assistant .markdown')].at(-1),"
        " '::before').content"
    )
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await say(page, "say nothing")
        assert await page.evaluate(note) == '"(empty reply)"'
        # A reply with text says nothing of the kind.
        await say(page, "in markdown")
        assert await page.evaluate(note) == "none"
        assert not page.exceptions, page.exceptions


async def test_a_failed_run_says_so_when_its_session_is_opened_again(
    tool_server: tuple[str, str],
) -> None:
    # Opened again, the session showed the question alone: nothing said the run failed.
    url, key = tool_server
    shown = (
        "[[...document.querySelectorAll('#messages .message')].map((m) => m.textContent),"
        " document.getElementById('run-status').textContent]"
    )
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await say(page, "fail")
        live = await page.evaluate(shown)
        await reopen_session(page, "document.querySelector('.message.failed')")
        await page.wait_for("document.getElementById('run-status').textContent !== ''")
        reopened = await page.evaluate(shown)
        assert not page.exceptions, page.exceptions
    assert live[1] == "The run failed."
    assert live[0][-1].endswith("the weather service is down")
    assert reopened[1] == live[1]
    assert reopened[0][0] == "Youfail"
    assert reopened[0][-1] == live[0][-1]


async def test_a_long_reply_in_small_pieces_streams_to_the_end(
    tool_server: tuple[str, str],
) -> None:
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        reply = await say(page, "a long reply in small pieces")
        assert reply == "abcdefghi " * 10_000
        # The log follows the reply to its end.
        await page.wait_for(
            "(() => { const log = document.getElementById('messages');"
            " return log.scrollHeight > log.clientHeight"
            " && log.scrollTop + log.clientHeight >= log.scrollHeight - 1; })()"
        )
        assert not page.exceptions, page.exceptions


# Counts the nodes put into an element whose direction the browser works out from its text
# (dir="auto", its own or an ancestor's), where it works it out again at each node put in;
# but for a message's parts, each put whole into its body.
WATCH_DIRECTED = """
(() => {
  window.putIntoDirected = 0;
  const count = (nodes) => nodes.reduce(
    (sum, node) => sum + (node instanceof DocumentFragment ? node.childNodes.length : 1), 0
  );
  const methods = [
    [Element.prototype, "append", (nodes) => nodes],
    [Element.prototype, "prepend", (nodes) => nodes],
    [Element.prototype, "replaceChildren", (nodes) => nodes],
    [Node.prototype, "appendChild", (nodes) => nodes.slice(0, 1)],
    [Node.prototype, "insertBefore", (nodes) => nodes.slice(0, 1)],
  ];
  for (const [prototype, name, put] of methods) {
    const original = prototype[name];
    prototype[name] = function (...nodes) {
      const part = this instanceof Element && this.matches(".message .body");
      if (this instanceof Element && !part && this.closest('[dir="auto"]')) {
        window.putIntoDirected += count(put(nodes));
      }
      return original.apply(this, nodes);
    };
  }
  return true;
})()
"""


async def test_a_reply_of_thousands_of_lines_is_shown_without_freezing_the_page(
    tool_server: tuple[str, str],
) -> None:
    # Each paragraph, list item and table cell was set to take the direction of its text
    # before its lines were put in, and a streamed reply's blocks were put in the message on
    # the page: the browser worked the direction out again at each line, a time in the square
    # of their number (20,000 short lines or paragraphs froze the tab for 1 to 10 s, at every
    # piece shown).
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.evaluate(WATCH_DIRECTED)
        reply = await say(page, "in many lines")
        paragraphs = await page.evaluate(
            "[...document.querySelectorAll('.message.assistant .markdown > p')]"
            ".map((p) => [p.dir, p.querySelectorAll('br').length])"
        )
        put = await page.evaluate("window.putIntoDirected")
        assert not page.exceptions, page.exceptions
    assert reply == MANY_LINES.replace("\n", "")
    assert paragraphs == [["auto", 1_999]] + [["auto", 0]] * 2_000
    assert put == 0, put


# The window of a 1280 x 820 laptop zoomed to 200%, and to 400% (WCAG's reflow width).
ZOOMED = [(640, 410), (320, 480)]

IN_VIEW = """
(() => {
  const page = document.documentElement;
  const composer = document.getElementById("composer").getBoundingClientRect();
  const last = [...document.querySelectorAll(".message")].at(-1).getBoundingClientRect();
  const log = document.getElementById("messages").getBoundingClientRect();
  return {
    wider: page.scrollWidth > page.clientWidth,
    composerInView: composer.top >= 0 && composer.bottom <= innerHeight,
    lastInView: last.bottom <= composer.top + 1 && last.bottom > 0,
    conversation: Math.min(log.bottom, composer.top) - Math.max(log.top, 0),
    height: innerHeight,
  };
})()
"""


@pytest.mark.parametrize(("width", "height"), ZOOMED)
async def test_a_zoomed_in_window_keeps_the_conversation_readable(
    demo_url: str, keys: Keys, width: int, height: int
) -> None:
    async with chromium_page(width=width, height=height) as page:
        await sign_in(page, demo_url, keys.alice)
        await visible(page, "chat")
        box = "document.getElementById('composer-input').offsetHeight"
        empty = await page.evaluate(box)
        for number in range(4):
            await say(page, f"Message {number}: my name is Alice and this line wraps")
        await page.wait_for("document.querySelectorAll('.message').length >= 8")
        # Empty again, the message box is as high as it was (not as its wrapped placeholder).
        assert await page.evaluate(box) == empty
        await asyncio.sleep(0.2)  # the scroll to the end is made at the next frame
        view = await page.evaluate(IN_VIEW)
        path = await page.screenshot(f"chat-page-{width}x{height}.png")
        print(f"\nscreenshot at {width} x {height}: {path}")
        assert not view["wider"], "the page scrolls sideways"
        assert view["composerInView"] and view["lastInView"], view
        # The conversation has most of the window, not a strip between fixed panes.
        assert view["conversation"] >= view["height"] / 2, view
        # Reading back, the run's status line stays in view with the message box (it was
        # below it, at the end of the page, out of view).
        await page.evaluate(
            "document.getElementById('run-status').textContent = 'Error: the agent failed'"
        )
        await page.press("Home", "Home", 36)
        await page.evaluate("window.scrollTo(0, 0)")
        status = await page.evaluate(
            "(() => { const r = document.getElementById('run-status').getBoundingClientRect();"
            " return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight; })()"
        )
        assert status, await page.screenshot(f"chat-page-{width}x{height}-read-back.png")
        assert not page.exceptions, page.exceptions


RENDERED = """
(() => {
  const reply = [...document.querySelectorAll(".message.assistant .markdown")].at(-1);
  const all = (selector) => [...reply.querySelectorAll(selector)];
  return {
    heading: all(".heading").map((n) => n.textContent),
    strong: all("strong").map((n) => n.textContent),
    em: all("em").map((n) => n.textContent),
    code: all(":not(pre) > code").map((n) => n.textContent),
    links: all("a").map((n) => [n.textContent, n.getAttribute("href"), n.rel]),
    lists: all("ul > li, ol > li").map((n) => n.firstChild.textContent),
    nested: all(":scope li ol li").map((n) => n.textContent),
    quote: all("blockquote strong").map((n) => n.textContent),
    block: all("pre > code").map((n) => [n.textContent, n.dataset.language]),
    cells: all("td").map((n) => n.textContent),
    tags: [...new Set(all("*").map((n) => n.tagName.toLowerCase()))].sort(),
    injected: window.injected ?? null,
    text: reply.textContent,
  };
})()
"""


async def test_a_reply_in_markdown_is_shown_formatted_and_stays_text(
    tool_server: tuple[str, str],
) -> None:
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await say(page, "in markdown")
        await asyncio.sleep(0.1)  # the last piece's markdown is built at the next frame
        shown = await page.evaluate(RENDERED)
        path = await page.screenshot("chat-page-markdown.png")
        print(f"\nscreenshot of a markdown reply: {path}")
        # Opened again, the stored reply looks the same.
        await reopen_session(page, "document.querySelector('.message.assistant .markdown')")
        assert await page.evaluate(RENDERED) == shown
        assert not page.exceptions, page.exceptions
    assert shown["heading"] == ["Plan"]
    assert shown["strong"] == ["bold", "text"]
    assert shown["em"] == ["italic"]
    assert shown["code"] == ["code", "x < y"]
    assert shown["links"] == [
        ["the docs", "https://example.com/docs?a=1&b=2", "noopener noreferrer"],
        ["https://example.com/x", "https://example.com/x", "noopener noreferrer"],
    ]
    assert shown["lists"] == ["one", "two with ", "nested", "first", "second"]
    assert shown["nested"] == ["nested"]
    assert shown["quote"] == ["text"]
    assert shown["block"] == [['print("<b>hi</b>")', "python"]]
    assert shown["cells"] == ["a", "1", "b | c", "2"]
    # Markup in the reply is text: no script, no image, no javascript: link ran or was made.
    assert shown["injected"] is None
    assert "script" not in shown["tags"] and "img" not in shown["tags"]
    assert "<script>window.injected = 1</script>" in shown["text"]
    assert "[click](javascript:window.injected=3)" in shown["text"]
    assert "[relative](/sessions)" in shown["text"] and "**unclosed" in shown["text"]
    assert "2 * 3 * 4, snake_case_name" in shown["text"]


NESTING = """
(async () => {
  const { markdown } = await import("/web/markdown.js");
  const nestedList = [...Array(3000).keys()].map((i) => "  ".repeat(i) + "- x").join("\\n");
  const depth = (fragment, tag) => {
    const box = document.createElement("div");
    box.append(fragment);
    let deepest = 0;
    for (const node of box.querySelectorAll(tag)) {
      let levels = 0;
      for (let up = node; up !== box; up = up.parentElement) levels += up.matches(tag);
      deepest = Math.max(deepest, levels);
    }
    return [deepest, box.textContent.length];
  };
  return {
    quotes: depth(markdown("> ".repeat(20000) + "end"), "blockquote"),
    lists: depth(markdown(nestedList), "li"),
    fence: markdown("```not `a` fence\\ncode").querySelector("pre") === null,
  };
})()
"""


async def test_markdown_nested_without_end_is_cut_at_a_depth_not_a_stack_overflow(
    demo_url: str,
) -> None:
    async with chromium_page() as page:
        await page.send("Page.navigate", url=f"{demo_url}/")
        await page.wait_for("document.readyState === 'complete'")
        shown = await page.evaluate(NESTING)
        assert not page.exceptions, page.exceptions
    # Eight levels, then the rest is text; nothing is lost.
    assert shown["quotes"][0] == 8 and shown["quotes"][1] > 20_000
    assert shown["lists"][0] <= 9 and shown["lists"][1] >= 3_000
    assert shown["fence"] is True


REASONING_SHOWN = """
(() => {
  const item = document.querySelector(".message.reasoning");
  const folded = item.querySelector(":scope > details");
  return {
    who: item.querySelector(".who").textContent,
    open: folded.open,
    text: folded.querySelector(".body").textContent,
    summary: folded.querySelector("summary").textContent,
    replies: [...document.querySelectorAll(".message.assistant:not(.reasoning) .body")].map(
      (n) => n.textContent
    ),
  };
})()
"""


async def test_reasoning_is_shown_while_it_streams_then_folded_away(
    tool_server: tuple[str, str],
) -> None:
    url, key = tool_server
    REASONING_SEEN.clear()
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.evaluate("document.getElementById('composer-input').focus()")
        await page.type_text("think first")
        await page.press(*ENTER)
        # While the model thinks, its reasoning is open to read.
        try:
            await page.wait_for(
                "document.querySelector('.message.reasoning.streaming details[open]') !== null"
            )
        finally:
            REASONING_SEEN.set()
        await page.wait_for("!document.getElementById('send').hidden")
        shown = await page.evaluate(REASONING_SHOWN)
        # Opened again, the stored session shows it the same way.
        await reopen_session(page, "document.querySelector('.message.reasoning')")
        assert await page.evaluate(REASONING_SHOWN) == shown
        assert not page.exceptions, page.exceptions
    assert shown == {
        "who": "Reasoning",
        "open": False,
        "text": "The user wants a **short** answer.",  # the model's notes: not markdown
        "summary": "Show the reasoning",
        "replies": ["Short answer."],
    }


async def test_reasoning_in_many_pieces_is_shown_a_frame_at_a_time(
    tool_server: tuple[str, str],
) -> None:
    # Each piece was added to the text shown so far: 60,000 pieces froze the page for seconds.
    url, key = tool_server
    REASONING_SEEN.clear()
    streamed = "document.querySelector('.message.reasoning.streaming .body')"
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.evaluate(
            "window.reasoningUpdates = 0;"
            " new MutationObserver((records) => { for (const record of records) {"
            " if (record.target.closest?.('.message.reasoning .body .text'))"
            " window.reasoningUpdates += 1; } })"
            ".observe(document.getElementById('messages'), {subtree: true, childList: true});"
            " true"
        )
        await page.type_text("think at length")
        await page.press(*ENTER)
        try:
            await page.wait_for(
                f"{streamed}?.textContent.length === {len('abcdefgh ') * LONG_REASONING_PIECES}"
            )
            updates = await page.evaluate("window.reasoningUpdates")
        finally:
            REASONING_SEEN.set()
        await page.wait_for("!document.getElementById('send').hidden")
        assert not page.exceptions, page.exceptions
    # Shown once a frame, as a reply's text: not once a piece.
    assert 0 < updates < LONG_REASONING_PIECES / 10


async def markdown_of(url: str, text: str, shown: str) -> Any:
    """``shown``, an expression on ``box``: ``text`` built as a reply's markdown by the chat
    page at ``url`` (markdown.js)."""
    script = f"""
(async () => {{
  const {{ markdown }} = await import("/web/markdown.js");
  const box = document.createElement("div");
  box.className = "markdown";
  document.body.append(box);
  box.append(markdown({json.dumps(text)}));
  return {shown};
}})()
"""
    async with chromium_page() as page:
        await page.send("Page.navigate", url=f"{url}/")
        await page.wait_for("document.readyState === 'complete'")
        result = await page.evaluate(script)
        assert not page.exceptions, page.exceptions
    return result


# What a text's markdown shows: its first block's HTML; its text and the addresses it links to.
FIRST_BLOCK = "box.firstChild.innerHTML"
TEXT_AND_LINKS = (
    '[box.textContent, [...box.querySelectorAll("a")].map((n) => n.getAttribute("href"))]'
)

# A presigned download link as object stores give them: over 2,000 characters.
PRESIGNED = "https://bucket.s3.amazonaws.com/report.pdf?X-Amz-Security-Token=" + "T" * 2400
LONG_TEXT = (
    "[" * 200_000
    + " **"
    + ("bold " * 300).strip()
    + f"** [the report]({PRESIGNED}) or {PRESIGNED}."
)
LONG_SPANS = """{
  opened: box.textContent.startsWith("[".repeat(200000) + " bold"),
  bold: [...box.querySelectorAll("strong")].map((n) => n.textContent.length),
  links: [...box.querySelectorAll("a")].map((n) => [n.textContent, n.getAttribute("href")]),
}"""


async def test_markdown_of_a_long_text_is_built_in_one_pass_with_whole_links(
    demo_url: str,
) -> None:
    # 200,000 "[" never closed took most of a second to build (a megabyte, seconds), at
    # every rebuild of a streamed reply, and a link, bold text or URL over a bound was cut.
    shown = await markdown_of(demo_url, LONG_TEXT, LONG_SPANS)
    assert shown["opened"] is True
    assert shown["bold"] == [len("bold ") * 300 - 1]
    assert shown["links"] == [["the report", PRESIGNED], [PRESIGNED, PRESIGNED]]


async def test_a_line_under_a_table_row_of_spaces_alone_is_built_in_one_pass(
    demo_url: str,
) -> None:
    # The rule under a table's header was matched with two runs of spaces side by side: a
    # line holding "|" over a long run of spaces took a time growing with its square (20 KB
    # most of a second, 120 KB froze the tab for minutes).
    text = "a|b\n" + " " * 1_000_000 + "x\n\n| a | b |\n| :-- | --: |\n| 1 | 2 |"
    shown = await markdown_of(
        demo_url,
        text,
        '[box.querySelectorAll("table").length, box.querySelectorAll("td").length]',
    )
    assert shown == [1, 2]


# The body of the reply to /process comes in pieces of 1,000 bytes (as over a slow network),
# and every search the page makes with a regular expression is measured: how far into its
# text it looked.
IN_SMALL_PIECES = """
(() => {
  window.searched = 0;
  window.received = 0;
  const exec = RegExp.prototype.exec;
  RegExp.prototype.exec = function (text) {
    const from = this.global || this.sticky ? this.lastIndex : 0;
    const found = exec.call(this, text);
    const to = found ? found.index + found[0].length : String(text).length;
    window.searched += this.sticky ? 1 : to - from;
    return found;
  };
  const send = window.fetch;
  window.fetch = async (input, init) => {
    const reply = await send(input, init);
    if (String(input) !== "process") return reply;
    const pieces = new TransformStream({
      transform(chunk, out) {
        window.received += chunk.length;
        for (let at = 0; at < chunk.length; at += 1000) out.enqueue(chunk.slice(at, at + 1000));
      },
    });
    return new Response(reply.body.pipeThrough(pieces), reply);
  };
  return true;
})()
"""


async def test_a_large_event_in_small_pieces_is_read_in_one_pass(
    tool_server: tuple[str, str],
) -> None:
    # Every piece searched the whole event received so far for its end: a megabyte in
    # pieces of a kilobyte was searched a thousand times over.
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.evaluate(IN_SMALL_PIECES)
        assert await say(page, "a large tool result") == "The log is read."
        shown = await page.evaluate("document.querySelectorAll('.message.tool pre')[1].textContent")
        searched, received = await page.evaluate("[window.searched, window.received]")
        assert not page.exceptions, page.exceptions
    assert shown == LARGE_LOG
    assert received > 2 * len(LARGE_LOG)  # the result, then the message and run holding it
    assert searched < 5 * received, (searched, received)


PASTED = "Please review:\n\ndef total(items):\n    return sum(items)\n" + "\n".join(
    f"item {number}" for number in range(8)
)
AT_THE_END = """
(() => {
  const log = document.getElementById("messages");
  return log.scrollTop + log.clientHeight >= log.scrollHeight - 1;
})()
"""
COMPOSER = """
(() => {
  const box = document.getElementById("composer-input");
  return {value: box.value, height: box.offsetHeight, whole: box.scrollHeight <= box.clientHeight};
})()
"""


async def paste(page: Page, text: str) -> None:
    """Paste ``text`` into the focused element with Ctrl+V, from the clipboard."""
    await page.send(
        "Browser.grantPermissions",
        permissions=["clipboardReadWrite", "clipboardSanitizedWrite"],
    )
    await page.evaluate(f"navigator.clipboard.writeText({json.dumps(text)})")
    keys = {"key": "v", "code": "KeyV", "windowsVirtualKeyCode": 86, "modifiers": 2}
    await page.send("Input.dispatchKeyEvent", type="keyDown", commands=["paste"], **keys)
    await page.send("Input.dispatchKeyEvent", type="keyUp", **keys)


async def test_a_pasted_text_of_many_lines_is_seen_whole_and_sent_as_it_is(
    tool_server: tuple[str, str],
) -> None:
    # The box stayed two lines high: a pasted text was seen through a slit, its end alone.
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await say(page, "a long reply in small pieces")  # a conversation taller than its log
        empty = await page.evaluate(COMPOSER)
        await paste(page, PASTED)
        pasted = await page.evaluate(COMPOSER)
        assert pasted["value"] == PASTED and pasted["whole"], pasted
        assert pasted["height"] > empty["height"]
        # The reply's end stays in view above the grown box.
        await asyncio.sleep(0.2)  # the scroll to the end is made at the next frame
        assert await page.evaluate(AT_THE_END)
        # Its line breaks did not send it: Enter does.
        assert await page.evaluate("document.querySelectorAll('.message.user').length") == 1
        await say(page, "")
        sent = await page.evaluate(
            "[...document.querySelectorAll('.message.user .body')].at(-1).textContent"
        )
        assert sent == PASTED
        assert await page.evaluate(COMPOSER) == empty
        assert not page.exceptions, page.exceptions


# Code in a numbered step, as models write it: indented as the step's text.
CODE_IN_A_STEP = """1. Write the function:
   ```python
   def first(items):
       for item in items:
           return item
   ```
2. Run it:
  ```
  $ python first.py
  ```
"""
CODE_SHOWN = """[...box.querySelectorAll("li")].map((item) => [
  item.firstChild.textContent, item.querySelector("pre")?.textContent,
])"""


async def test_code_in_a_list_item_keeps_its_indentation(demo_url: str) -> None:
    # Each line lost up to four spaces: the loop's body was one space in from its "for".
    shown = await markdown_of(demo_url, CODE_IN_A_STEP, CODE_SHOWN)
    assert shown == [
        ["Write the function:", "def first(items):\n    for item in items:\n        return item"],
        ["Run it:", "$ python first.py"],
    ]


STEPS_WITH_BLANK_LINES = """1. Write the function:
   ```python
   import sys

   print(sys.argv)
   ```

   Save it as `args.py`.
2. Run it.

That is all.
"""
STEPS_SHOWN = """{
  steps: [...box.querySelectorAll("ol > li")].map((item) => item.textContent),
  code: [...box.querySelectorAll("pre")].map((pre) => pre.textContent),
  after: [...box.children].at(-1).outerHTML,
}"""


async def test_a_list_item_goes_on_after_a_blank_line_in_it(demo_url: str) -> None:
    # The blank line in the code ended the list: the rest of the code was a paragraph, and
    # its closing fence opened a code block that took the rest of the reply.
    shown = await markdown_of(demo_url, STEPS_WITH_BLANK_LINES, STEPS_SHOWN)
    assert shown == {
        "steps": [
            "Write the function:import sys\n\nprint(sys.argv)Save it as args.py.",
            "Run it.",
        ],
        "code": ["import sys\n\nprint(sys.argv)"],
        "after": '<p dir="auto">That is all.</p>',
    }


async def test_a_message_the_server_does_not_take_goes_back_to_the_box(
    tool_server: tuple[str, str],
) -> None:
    # It stayed in the conversation as if sent, and was gone from the box: refused for its
    # size, or with the server out of reach, it had to be typed or pasted again.
    url, key = tool_server
    too_large = "log line\n" * 120_000  # over the server's 1 MiB a request
    box = "document.getElementById('composer-input').value"
    status = "document.getElementById('run-status').textContent"
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.evaluate(
            f"{box} = {json.dumps(too_large)}; document.getElementById('composer').requestSubmit()"
        )
        await page.wait_for(f"{status}.startsWith('Error:')")
        assert await page.evaluate(box) == too_large.strip()
        assert await page.evaluate("document.querySelectorAll('.message').length") == 0
        assert "(PAYLOAD_TOO_LARGE)" in await page.evaluate(status)
        assert (await page.evaluate(status)).endswith("it is back in the box.")

        await page.send("Network.setBlockedURLs", urls=["*/process"])
        await page.evaluate(f"{box} = 'hello'; document.getElementById('composer').requestSubmit()")
        await page.wait_for(f"{status}.startsWith('Error:')")
        assert await page.evaluate(status) == (
            "Error: the server cannot be reached. The message was not sent: it is back in the box."
        )
        assert await page.evaluate(box) == "hello"
        assert await page.evaluate("document.querySelectorAll('.message').length") == 0
        # Once the server is back, Enter sends it.
        await page.send("Network.setBlockedURLs", urls=[])
        assert await say(page, "") == "Here is the chart of sales by quarter."
        sent = "[...document.querySelectorAll('.message.user .body')].map((b) => b.textContent)"
        assert await page.evaluate(sent) == ["hello"]
        assert not page.exceptions, page.exceptions


async def test_a_pasted_snippet_is_sent_with_its_first_lines_indentation(
    tool_server: tuple[str, str],
) -> None:
    # The message was trimmed: the snippet's first line lost its indentation, the others not.
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await paste(page, "\n    if ready:\n        start()\n\n")
        await say(page, "")
        sent = await page.evaluate("document.querySelector('.message.user .body').textContent")
        assert sent == "    if ready:\n        start()"
        assert not page.exceptions, page.exceptions


ESCAPED = (
    r"""\# Not a heading, 2 \* 3 \* 4 and *one \* two*, snake\_case, \[not a link\](x), \`x\`"""
)
ESCAPES_SHOWN = (
    '[box.textContent, [...box.querySelectorAll("*")].map((n) => [n.tagName, n.textContent])]'
)


async def test_markdown_punctuation_a_backslash_escapes_is_shown_without_it(
    demo_url: str,
) -> None:
    # The backslashes showed ("snake\\_case"), and an escaped "*" closed an italic.
    text, tags = await markdown_of(demo_url, ESCAPED, ESCAPES_SHOWN)
    assert text == "# Not a heading, 2 * 3 * 4 and one * two, snake_case, [not a link](x), `x`"
    assert tags == [["P", text], ["EM", "one * two"]]


async def test_the_enter_that_picks_a_word_in_an_input_method_does_not_send(
    tool_server: tuple[str, str],
) -> None:
    # Safari gives that Enter as keyCode 229 with isComposing false: the message went
    # half-typed, as the user picked its first word.
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.type_text("東京")
        picked = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 229}
        await page.send("Input.dispatchKeyEvent", type="rawKeyDown", **picked)
        await page.send("Input.dispatchKeyEvent", type="keyUp", **picked)
        await asyncio.sleep(0.2)
        assert await page.evaluate("document.querySelectorAll('.message').length") == 0
        assert await page.evaluate("document.getElementById('composer-input').value") == "東京"
        assert not page.exceptions, page.exceptions


WIKIPEDIA = "https://en.wikipedia.org/wiki/Python_(programming_language)"
PARENTHESES = f"[Python]({WIKIPEDIA}), {WIKIPEDIA}. (See also https://docs.python.org/3/.)"


async def test_a_link_to_an_address_holding_parentheses_is_whole(demo_url: str) -> None:
    # The address was cut at its "(": a link to ".../Python_", or no link at all.
    text, links = await markdown_of(demo_url, PARENTHESES, TEXT_AND_LINKS)
    assert links == [WIKIPEDIA, WIKIPEDIA, "https://docs.python.org/3/"]
    assert text == f"Python, {WIKIPEDIA}. (See also https://docs.python.org/3/.)"


TITLED_LINKS = (
    "[docs](https://example.com/a \"The docs\") and [guide](https://example.com/b 'A guide')"
    ' but [not](javascript:alert(1) "x") nor [this](/sessions "y").'
)
SHOWN_LINKS = (
    '[box.textContent, [...box.querySelectorAll("a")]'
    '.map((n) => [n.textContent, n.getAttribute("href"), n.title])]'
)


async def test_a_link_with_a_title_is_a_link_titled_so(demo_url: str) -> None:
    # The title was taken for part of the address: no link, its markdown shown as text.
    text, links = await markdown_of(demo_url, TITLED_LINKS, SHOWN_LINKS)
    assert links == [
        ["docs", "https://example.com/a", "The docs"],
        ["guide", "https://example.com/b", "A guide"],
    ]
    assert text == ('docs and guide but [not](javascript:alert(1) "x") nor [this](/sessions "y").')


SETEXT = "Title\n=====\nSub *title*\nwritten on two lines\n---\ntext\n\n---\n\nend"
BLOCKS = "[...box.children].map((n) => [n.tagName, n.className, n.textContent])"


async def test_a_line_underlined_with_equals_or_dashes_is_a_heading(demo_url: str) -> None:
    # "Title" and "=====" were a paragraph; the "---" under a paragraph was a rule.
    blocks = await markdown_of(demo_url, SETEXT, BLOCKS)
    assert blocks == [
        ["P", "heading level-1", "Title"],
        ["P", "heading level-2", "Sub title written on two lines"],
        ["P", "", "text"],
        ["HR", "", ""],  # after a blank line, "---" is a rule
        ["P", "", "end"],
    ]


BOLD_ITALIC = "***Note:*** read **all of *this***."


async def test_bold_italic_text_written_with_three_stars_shows_no_star(demo_url: str) -> None:
    # "***Note:***" showed as a bold "*Note:" and a star after it.
    shown = await markdown_of(demo_url, BOLD_ITALIC, FIRST_BLOCK)
    assert shown == ("<strong><em>Note:</em></strong> read <strong>all of <em>this</em></strong>.")


async def test_signing_out_leaves_nothing_for_the_next_to_sign_in(
    demo_url: str, keys: Keys
) -> None:
    # The next user found the message being written in the box, and the sessions of the one
    # before in the list (for good when theirs could not be loaded).
    session = f"alice-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(headers=bearer(keys.alice)) as client:
        created = await client.post(f"{demo_url}/sessions", json={"session_id": session})
        assert created.status_code == 201
    async with chromium_page() as page:
        await sign_in(page, demo_url, keys.alice)
        await page.wait_for(f"document.querySelector('[data-session=\"{session}\"]') !== null")
        await page.type_text("my password is")
        await page.evaluate("document.getElementById('sign-out').click()")
        await page.send("Network.setBlockedURLs", urls=["*/sessions?limit=1000*"])
        await page.wait_for("document.activeElement.id === 'api-key'")
        await page.type_text(keys.bob)
        await page.press(*ENTER)
        await visible(page, "chat")
        await page.wait_for(
            "document.getElementById('sessions-status').textContent.startsWith('Cannot reach')"
        )
        assert await page.evaluate("document.getElementById('composer-input').value") == ""
        assert await page.evaluate("document.querySelectorAll('#sessions button').length") == 0
        assert not page.exceptions, page.exceptions


# Counts the sessions lists the page asks for, and those it is done with (read, once what it
# does with them is done, or failed): a test then knows a late list was taken, or dropped.
COUNT_LISTS = """
window.listsAsked = 0;
window.listsDone = 0;
const realFetch = window.fetch;
window.fetch = function (input, init) {
  if (!String(input).startsWith("sessions?limit=1000")) return realFetch.call(this, input, init);
  window.listsAsked += 1;
  const done = () => setTimeout(() => { window.listsDone += 1; });
  return realFetch.call(this, input, init).then((response) => {
    const json = response.json.bind(response);
    response.json = () => json().finally(done);
    return response;
  }, (error) => { done(); throw error; });
};
"""


@pytest.fixture
def own_keys() -> Keys:
    """Keys of a store of their own (a server stops its key store as it stops)."""
    return Keys.make()


async def test_a_list_still_loading_at_sign_out_does_not_reach_the_next_to_sign_in(
    own_keys: Keys,
) -> None:
    # Alice's sessions, asked for before she signed out, landed in Bob's list once they came.
    listing, gate = threading.Event(), threading.Event()
    app = create_app(["sessions"], settings=load_settings(web_ui=True), key_store=own_keys.store)
    history = app.state.context.services.session_history
    listed = history.list_sessions_page

    async def held(user_id: str, *, limit: int, cursor: str | None = None) -> Any:
        if user_id == "alice" and limit > 1:  # her list, not the sign-in's check
            listing.set()
            await asyncio.to_thread(gate.wait, 30)
        return await listed(user_id, limit=limit, cursor=cursor)

    history.list_sessions_page = held  # type: ignore[method-assign]
    session = f"alice-{uuid.uuid4().hex[:8]}"
    with running(app) as url:
        async with httpx.AsyncClient(headers=bearer(own_keys.alice)) as client:
            created = await client.post(f"{url}/sessions", json={"session_id": session})
            assert created.status_code == 201
        try:
            async with chromium_page() as page:
                await page.send("Page.addScriptToEvaluateOnNewDocument", source=COUNT_LISTS)
                await sign_in(page, url, own_keys.alice)
                assert await asyncio.to_thread(listing.wait, 30)
                await page.evaluate("document.getElementById('sign-out').click()")
                await page.wait_for("document.activeElement.id === 'api-key'")
                await page.type_text(own_keys.bob)
                await page.press(*ENTER)
                status = "document.getElementById('sessions-status').textContent"
                await page.wait_for(f"{status} === 'No sessions yet.'")
                gate.set()
                await page.wait_for("window.listsDone === window.listsAsked")
                assert await page.evaluate("window.listsAsked") == 2
                assert await page.evaluate(f"{status} === 'No sessions yet.'")
                buttons = "document.querySelectorAll('#sessions button').length"
                assert await page.evaluate(buttons) == 0
                assert not page.exceptions, page.exceptions
        finally:
            gate.set()


# Counts the requests the page makes, and those that have settled (and what the page did
# with their answers, its microtasks, is done).
COUNT_REQUESTS = """
window.asked = 0;
window.settled = 0;
const realFetch = window.fetch;
window.fetch = function (input, init) {
  window.asked += 1;
  const done = () => setTimeout(() => { window.settled += 1; });
  return realFetch.call(this, input, init).finally(done);
};
"""


async def test_signing_out_during_a_reply_asks_nothing_more_with_no_key(
    tool_server: tuple[str, str],
) -> None:
    # The run's end reloaded the sessions list with no key: the server's 401 then showed
    # "Your key was not accepted" to whoever had just signed out.
    url, key = tool_server
    async with chromium_page() as page:
        await page.send("Page.addScriptToEvaluateOnNewDocument", source=COUNT_REQUESTS)
        await sign_in(page, url, key)
        await start_a_long_run(page)
        saved = "JSON.parse(sessionStorage.getItem('agentscope-serverless.run') || '{}').id"
        run_id = await page.wait_for(saved)
        await page.evaluate("document.getElementById('sign-out').click()")
        await page.wait_for("window.settled === window.asked")
        assert await page.evaluate("document.getElementById('sign-in-error').textContent") == ""
        assert not page.exceptions, page.exceptions
    async with httpx.AsyncClient(base_url=url, headers=bearer(key)) as client:
        run = (await client.get(f"/runs/{run_id}")).json()
        assert run["cancel_requested"] or run["status"] == "canceled", run


async def test_the_escape_that_drops_a_word_in_an_input_method_does_not_stop_the_run(
    tool_server: tuple[str, str],
) -> None:
    # Writing the next message while a reply streams, dropping a word being put together
    # (Escape, to the input method) stopped the run.
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.type_text("take your time")
        await page.press(*ENTER)
        await page.wait_for(STREAMING)
        dropped = {"key": "Escape", "code": "Escape", "windowsVirtualKeyCode": 229}
        await page.send("Input.dispatchKeyEvent", type="rawKeyDown", **dropped)
        await page.send("Input.dispatchKeyEvent", type="keyUp", **dropped)
        await asyncio.sleep(0.2)
        assert await page.evaluate(STREAMING)
        await page.press("Escape", "Escape", 27)  # Escape itself stops it
        await page.wait_for("document.getElementById('run-status').textContent === 'Stopped.'")
        assert not page.exceptions, page.exceptions


ALIGNED_TABLE = "| plan | price | seats |\n|:-----|------:|:-----:|\n| Team | $25 | 10 |"
ALIGNMENTS = """[...box.querySelectorAll("tr")].map((row) =>
  [...row.children].map((cell) => getComputedStyle(cell).textAlign)
)"""


async def test_table_columns_are_aligned_as_the_rule_under_their_header_says(demo_url: str) -> None:
    # Every column was aligned left: prices and counts the rule set right or centre too.
    shown = await markdown_of(demo_url, ALIGNED_TABLE, ALIGNMENTS)
    assert shown == [["left", "right", "center"], ["left", "right", "center"]]


SHORT_RULES = "| step | done |\n|--|:-:|\n| build | yes |\n\nA | B\n-\nthe end"
SHORT_RULES_SHOWN = "[...box.children].map((n) => [n.tagName, n.textContent])"


async def test_a_table_whose_rule_has_short_dashes_is_a_table(demo_url: str) -> None:
    # A rule of fewer than three dashes a cell (|--|:-:|), as models often write, left the
    # table as lines of text with their pipes.
    shown = await markdown_of(demo_url, SHORT_RULES, SHORT_RULES_SHOWN)
    # A line with a pipe over a dash with fewer cells is no table.
    assert shown == [["DIV", "stepdonebuildyes"], ["P", "A | B-the end"]]


FIELD_SIZES = """
[...document.querySelectorAll("input, textarea")].map(
  (field) => [field.id, parseFloat(getComputedStyle(field).fontSize)]
)
"""


async def test_the_fields_a_phone_user_taps_are_not_zoomed_into(demo_url: str, keys: Keys) -> None:
    # Their text was 15 px: Safari on iOS zooms the page into a field under 16 px as it is
    # tapped, and leaves it zoomed, the page wider than the screen.
    async with chromium_page(width=390, height=844) as page:
        await sign_in(page, demo_url, keys.bob)
        sizes = await page.evaluate(FIELD_SIZES)
        assert not page.exceptions, page.exceptions
    assert sizes == [["api-key", 16], ["composer-input", 16]]


IN_ANGLE_BRACKETS = "The docs: <https://example.com/docs>. Compare a <b> c."


async def test_a_url_in_angle_brackets_is_a_link_shown_without_them(demo_url: str) -> None:
    # The brackets showed around the link, as "<https://...>".
    text, links = await markdown_of(demo_url, IN_ANGLE_BRACKETS, TEXT_AND_LINKS)
    assert text == "The docs: https://example.com/docs. Compare a <b> c."
    assert links == ["https://example.com/docs"]


STRUCK = "Price: ~~$30~~ **$25**, about ~ 20 ~ euros."


async def test_text_between_double_tildes_is_struck_through(demo_url: str) -> None:
    # The tildes showed ("~~$30~~"), the old price as current as the new one.
    shown = await markdown_of(demo_url, STRUCK, FIRST_BLOCK)
    assert shown == "Price: <del>$30</del> <strong>$25</strong>, about ~ 20 ~ euros."


RESULTS_OPEN = "[...document.querySelectorAll('.message.tool details')].map((d) => d.open)"


async def test_a_long_tool_result_is_folded_away(tool_server: tuple[str, str]) -> None:
    # A megabyte a tool read was shown open, 40,000 lines between the call and the reply.
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await say(page, "a plugin")
        await say(page, "a large tool result")
        # The calls are folded, the short result open, the long one folded.
        shown = await page.evaluate(RESULTS_OPEN)
        await reopen_session(page, "document.querySelector('.message.tool')")
        await page.wait_for("document.getElementById('run-status').textContent === ''")
        assert await page.evaluate(RESULTS_OPEN) == shown
        assert not page.exceptions, page.exceptions
    assert shown == [False, True, False, False]


async def test_inline_code_keeps_its_spaces(demo_url: str) -> None:
    # Its spaces were collapsed: `ls  -la` showed as `ls -la`, aligned columns as one space.
    widths = "[...box.querySelectorAll('code')].map((code) => code.offsetWidth)"
    one, four = await markdown_of(demo_url, "`a b` and `a    b`", widths)
    assert four > one


async def test_the_empty_message_box_is_not_marked_as_wrong(tool_server: tuple[str, str]) -> None:
    # It was a required field: once a message was sent, the empty box matched :user-invalid
    # (Firefox draws it red), and Enter in it popped up "Please fill out this field".
    url, key = tool_server
    flagged = "document.querySelector(':user-invalid') !== null"
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await say(page, "a plugin")
        assert not await page.evaluate(flagged)
        await page.press(*ENTER)
        assert not await page.evaluate(flagged)
        assert await page.evaluate("document.querySelectorAll('.message.user').length") == 1
        assert not page.exceptions, page.exceptions


async def test_sessions_are_listed_by_their_first_message_read_as_they_come_into_view(
    demo_url: str, keys: Keys
) -> None:
    # The list showed each session's id alone: 36 characters of hex a user cannot tell apart.
    key = (await keys.store.create_key(kind="user", user_id="titles")).key
    messages = f"{demo_url}/sessions/{{}}/messages"
    spaced = "  Plan a   trip\n to Lisbon " + "and Porto " * 20
    # An emoji (two UTF-16 code units) where the title is cut: cut in half, it showed as "�".
    emoji = "Q" * 78 + "\U0001f30d" + " and more"
    async with httpx.AsyncClient(headers=bearer(key), timeout=30) as client:
        for i in range(150):
            text = {149: spaced, 147: emoji}.get(i, f"question number {i}")
            body = {"messages": [{"role": "user", "content": text}]}
            assert (await client.post(messages.format(f"s{i:03}"), json=body)).status_code == 201
        replies_only = {"messages": [{"role": "assistant", "content": "hi"}]}
        assert (
            await client.post(messages.format("replies-only"), json=replies_only)
        ).status_code == 201
    async with chromium_page() as page:
        await sign_in(page, demo_url, key)
        first = "document.querySelector('#sessions button[data-session=\"replies-only\"]')"
        newest = "document.querySelector('#sessions button[data-session=\"s149\"]')"
        await page.wait_for(f"{newest}?.classList.contains('titled')")
        title = await page.evaluate(f"{newest}.textContent")
        assert title == ("Plan a trip to Lisbon " + "and Porto " * 20)[:79] + "…"
        assert await page.evaluate(f"{newest}.title") == f"{title}\ns149"
        assert await page.evaluate(f"{newest}.ariaLabel") == f"Open session {title}"
        await page.wait_for(
            "document.querySelector('#sessions button[data-session=\"s148\"]').textContent"
            " === 'question number 148'"
        )
        cut = "document.querySelector('#sessions button[data-session=\"s147\"]').textContent"
        await page.wait_for(f"{cut}.endsWith('…')")
        assert await page.evaluate(f"{cut}.isWellFormed()")
        assert await page.evaluate(cut) == "Q" * 78 + "…"
        assert await page.evaluate(f"{first}.textContent") == "replies-only"  # no text of theirs
        read = [r for r in page.requests if "/messages?limit=" in r]
        assert 0 < len(read) < 100, len(read)  # those in view, not all 151
        # Scrolled to the oldest, it is read too.
        oldest = "document.querySelector('#sessions button[data-session=\"s000\"]')"
        await page.evaluate(f"{oldest}.scrollIntoView()")
        await page.wait_for(f"{oldest}.textContent === 'question number 0'")
        assert not page.exceptions, page.exceptions


STREAMED_REFUSAL = "document.querySelector('.message.assistant.streaming .body')?.textContent"
SHOWN_REFUSAL = "document.querySelector('.message.assistant .body').textContent"


async def test_a_refusal_streamed_in_pieces_is_shown_whole_while_it_streams(
    tool_server: tuple[str, str],
) -> None:
    # Each piece replaced the one before: "help with that." showed, not the whole refusal.
    url, key = tool_server
    REFUSAL_SEEN.clear()
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.type_text("refuse")
        await page.press(*ENTER)
        try:
            streamed = await page.wait_for(
                f"{STREAMED_REFUSAL}?.endsWith({REFUSAL[-1]!r}) && {STREAMED_REFUSAL}"
            )
        finally:
            REFUSAL_SEEN.set()
        await page.wait_for("!document.getElementById('send').hidden")
        assert await page.evaluate(SHOWN_REFUSAL) == "".join(REFUSAL)
        assert not page.exceptions, page.exceptions
    assert streamed == "".join(REFUSAL)


async def test_a_refusal_stopped_while_it_streams_keeps_what_came(
    tool_server: tuple[str, str],
) -> None:
    # The stopped run's reply kept the last piece of the refusal alone.
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await page.type_text("refuse, then wait")
        await page.press(*ENTER)
        await page.wait_for(f"{STREAMED_REFUSAL}?.endsWith({REFUSAL[-1]!r})")
        await page.press("Escape", "Escape", 27)
        await page.wait_for("document.getElementById('run-status').textContent === 'Stopped.'")
        assert await page.evaluate(SHOWN_REFUSAL) == "".join(REFUSAL)
        assert not page.exceptions, page.exceptions


# Text a chat shows as nothing: whitespace and format characters (zero width space, word
# joiner, byte order mark, zero width non-joiner and joiner, soft hyphen).
INVISIBLE = " \u200b\u2060\ufeff\u200c\u200d\u00ad\n\u200b "


async def test_a_message_of_invisible_characters_is_neither_sent_nor_a_sessions_title(
    own_keys: Keys,
) -> None:
    # The page sent it (the server refuses it now); a session stored with one, from before
    # the server refused them, was listed as a blank button.
    app = create_app(
        settings=load_settings(web_ui=True), agent_app=demo_app, key_store=own_keys.store
    )
    history = app.state.context.services.session_history
    box = "document.getElementById('composer-input')"
    with running(app) as url:
        session = await history.create_session("alice", "invisible-first")
        await history.append_message(
            session, {"role": "user", "content": [{"type": "text", "text": INVISIBLE}]}
        )
        async with chromium_page() as page:
            await sign_in(page, url, own_keys.alice)
            button = "document.querySelector('#sessions button[data-session=\"invisible-first\"]')"
            await page.wait_for(f"{button} !== null")
            # Its first messages are read (to title it): they hold no text a user sees.
            await page.wait_for(
                "performance.getEntriesByType('resource')"
                ".some((entry) => entry.name.includes('/invisible-first/messages?limit='))"
            )
            await asyncio.sleep(0.2)
            assert await page.evaluate(f"{button}.textContent") == "invisible-first"
            assert not await page.evaluate(f"{button}.classList.contains('titled')")

            await page.evaluate(
                f"{box}.value = {json.dumps(INVISIBLE)};"
                " document.getElementById('composer').requestSubmit()"
            )
            await asyncio.sleep(0.5)
            assert not [r for r in page.requests if r == f"{url}/process"]
            assert await page.evaluate("document.querySelectorAll('.message').length") == 0
            assert await page.evaluate(f"{box}.value") == INVISIBLE
            assert not page.exceptions, page.exceptions


async def test_a_paragraph_in_a_script_written_right_to_left_reads_so(
    tool_server: tuple[str, str],
) -> None:
    # Hebrew or Arabic was set left to right, as the page.
    url, key = tool_server
    directions = (
        "[...document.querySelectorAll('#messages .message.assistant .body p')]"
        ".map((p) => getComputedStyle(p).direction)"
    )
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await say(page, "in two scripts")
        assert await page.evaluate(directions) == ["rtl", "ltr"]
        await say(page, "\u05e9\u05dc\u05d5\u05dd")
        user = "getComputedStyle([...document.querySelectorAll('.message.user .body')].at(-1))"
        assert await page.evaluate(f"{user}.direction") == "rtl"
        assert not page.exceptions, page.exceptions


async def test_a_failed_runs_error_is_shown_as_plain_text(tool_server: tuple[str, str]) -> None:
    # It was rendered as markdown: a URL in an exception's message became a link.
    url, key = tool_server
    async with chromium_page() as page:
        await sign_in(page, url, key)
        await say(page, "fail with a link")
        await page.wait_for("document.querySelector('.message.failed') !== null")
        failed = "document.querySelector('.message.failed')"
        assert await page.evaluate(f"{failed}.querySelectorAll('a, strong').length") == 0
        text = await page.evaluate(f"{failed}.querySelector('.body').textContent")
        assert text.endswith("see https://status.example.com/x for **why**")
        assert not page.exceptions, page.exceptions
