"""``invoke`` and ``chat`` against a URL that is not this project's server and misbehaves:
what it sends is read within the bounds ``HTTPAgentAPIClient`` reads an agent API within
(an event line of at most 16 Mi characters, the first 64 KiB of an error body, for a bounded
time), and a failure is one line that never shows the key."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
import tracemalloc
import zlib
from typing import Any

import pytest
from typer.testing import CliRunner

import agentscope_serverless.cli as cli_module
from agentscope_serverless.cli import app
from tests.cli.test_cli import SCRIPT, read_until
from tests.support.raw_server import raw_servers
from tests.support.signals import terminal_signals

KEY = "ask_hostile_s3cr3tpart"
TEXT_EVENT = b'data: {"object":"content","delta":true,"text":"Hello, ","msg_id":"m1"}\n\n'
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def invoke(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["invoke", "hi", "--url", url, "--key", KEY, *args])
    return result.exit_code, result.output


def chat(url: str, stdin: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["chat", "--url", url, "--key", KEY], input=stdin)
    return result.exit_code, result.output


def endless_line(connection: socket.socket, head: bytes) -> None:
    connection.sendall(STREAM_HEAD + TEXT_EVENT + b"data: ")
    for _ in range(48):  # 48 MiB, the line never ended: until the client leaves
        connection.sendall(b"a" * 1024**2)


@pytest.mark.parametrize("command", ["invoke", "chat"])
def test_an_event_line_that_never_ends_fails_once_past_16_mi_characters(command: str) -> None:
    # The command held the line whole, growing as long as the server went on.
    with raw_servers() as start:
        url = start(endless_line).url
        tracemalloc.start()
        try:
            code, output = invoke(url) if command == "invoke" else chat(url, "hi\nhello\n")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    said = "the server sent an event line longer than 16,777,216 characters"
    assert code == 1, output
    assert "Hello, " in output
    assert " ".join(output.split()).count(said) == 1, output
    assert KEY not in output and "s3cr3t" not in output
    assert peak < 40 * 1024**2
    if command == "chat":
        assert output.count("you>") == 1  # the chat ended on it


def test_a_data_line_that_is_not_json_is_an_error_of_one_line() -> None:
    # It ended in a traceback (json.JSONDecodeError).
    def not_json(connection: socket.socket, head: bytes) -> None:
        connection.sendall(STREAM_HEAD + TEXT_EVENT + b"data: <html>\n\ndata: [1]\n\n")

    with raw_servers() as start:
        code, output = invoke(start(not_json).url)
    assert code == 1, output
    assert "the server sent an event that is not a JSON object" in " ".join(output.split())
    assert "Traceback" not in output and KEY not in output


def test_an_error_body_that_never_ends_is_read_only_as_far_as_its_error_needs() -> None:
    # The whole body was read into memory (response.read()), however long it went on.
    error = b'{"error": {"code": "BAD_GATEWAY", "message": "upstream down"}}'

    def endless_error(connection: socket.socket, head: bytes) -> None:
        connection.sendall(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\n\r\n" + error
        )
        for _ in range(48):  # 48 MiB of spaces, the body never ended: until the client leaves
            connection.sendall(b" " * 1024**2)

    with raw_servers() as start:
        url = start(endless_error).url
        invoke(url)  # once first: the modules the command imports are not counted
        tracemalloc.start()
        try:
            code, output = invoke(url)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert code == 1, output
    assert "HTTP 502 BAD_GATEWAY: upstream down" in output
    assert KEY not in output
    assert peak < 8 * 1024**2


@pytest.mark.parametrize("command", ["invoke", "chat"])
def test_an_error_body_trickled_a_byte_at_a_time_fails_within_the_silence_bound(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    # The status and headers of a 500, then a byte every half second (each within the read
    # timeout): the command waited as long as the server went on.
    monkeypatch.setattr(cli_module, "SILENCE_SECONDS", 3.0)

    def trickling(connection: socket.socket, head: bytes) -> None:
        connection.sendall(
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\nConnection: close\r\n\r\n"
        )
        for _ in range(120):  # 60 s, far past the bound: until the client leaves
            connection.sendall(b" ")
            time.sleep(0.5)

    with raw_servers() as start:
        url = start(trickling).url
        began = time.monotonic()
        code, output = invoke(url) if command == "invoke" else chat(url, "hi\n")
        took = time.monotonic() - began
    said = f"{url} answered HTTP 500, and its error body did not all arrive within 3 s"
    assert said in " ".join(output.split()), output
    assert code == (1 if command == "invoke" else 0), output
    assert KEY not in output
    assert took < 20


def test_a_compressed_error_body_is_not_unpacked_whole() -> None:
    # 32 MiB of JSON (the error, then spaces) in a few KiB: gzip of gzip. httpx unpacked each
    # chunk received whole, all 32 MiB at once, before the command could count them.
    error = b'{"error": {"code": "BAD_GATEWAY", "message": "upstream down"}}'
    bomb = gzipped(gzipped(error + b" " * 32 * 1024**2))

    def compressed_error(connection: socket.socket, head: bytes) -> None:
        connection.sendall(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\n"
            b"Content-Encoding: gzip, gzip\r\nConnection: close\r\n"
            + f"Content-Length: {len(bomb)}\r\n\r\n".encode()
            + bomb
        )

    with raw_servers() as start:
        url = start(compressed_error).url
        invoke(url)  # once first: the modules the command imports are not counted
        tracemalloc.start()
        try:
            code, output = invoke(url)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert code == 1, output
    assert "HTTP 502 BAD_GATEWAY: upstream down" in output
    assert peak < 8 * 1024**2


def gzipped(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return compressor.compress(data) + compressor.flush()


def _slow_cancel_server() -> Any:
    """A server whose ``/process`` streams the start of a reply and then waits, and whose
    ``/runs/{id}/cancel`` answers 202 with a body trickled a byte every half second."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    async def reply() -> Any:
        yield TEXT_EVENT
        for _ in range(60):
            await asyncio.sleep(0.5)
            yield b": ping\n\n"

    async def trickle() -> Any:
        for _ in range(120):  # 60 s, far past what the test waits: until the client leaves
            yield b" "
            await asyncio.sleep(0.5)

    server = FastAPI()

    @server.post("/process")
    async def process() -> StreamingResponse:
        headers = {"X-Run-Id": "run-1", "X-Session-Id": "s1"}
        return StreamingResponse(reply(), media_type="text/event-stream", headers=headers)

    @server.post("/runs/{run_id}/cancel")
    async def cancel(run_id: str) -> StreamingResponse:
        return StreamingResponse(trickle(), status_code=202, media_type="application/json")

    return server


def test_ctrl_c_reads_no_body_of_the_cancel_answer() -> None:
    # Ctrl-C asked the server to cancel the run, then read its answer's whole body: one that
    # never ended (trickled, or endless) held the command, growing.
    from tests.support.http import running

    with running(_slow_cancel_server()) as url:
        command = subprocess.Popen(
            [SCRIPT, "invoke", "hi", "--url", url, "--key", KEY],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=terminal_signals,
        )
        assert command.stdout is not None
        try:
            seen = read_until(command.stdout, "Hello, ")
            command.send_signal(signal.SIGINT)
            began = time.monotonic()
            code = command.wait(timeout=30)
            took = time.monotonic() - began
            seen += command.stdout.read().decode()
        finally:
            command.kill()
    assert "stopped: the run was cancelled" in seen
    assert code == 130, seen
    assert took < 20
    assert KEY not in seen
