"""One confined agent process per sandbox, driven over its stdin/stdout one JSON line at a time.

The process starts on demand and starts again after it dies (a limit killed it, a call ran
past its time): the sandbox, its workspace and its place in the session mapping stay; only
the Python variables are lost, and the call that lost them says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

from agentscope_serverless.errors import SandboxUnavailableError
from agentscope_serverless.sandbox_protocol import CallToolResult

logger = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 15.0
# Time the agent gets past a call's own limit to report it, before the process is killed.
GRACE_SECONDS = 3.0
REPLY_LIMIT_BYTES = 64 * 1024**2
SIGNAL_NAMES = {
    signal.SIGXCPU: "its CPU time limit",
    signal.SIGKILL: "a kill signal (a time or memory limit)",
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGXFSZ: "its file size limit",
}


def _death_reason(returncode: int) -> str:
    # bwrap exits with 128 + signal when the program it runs dies of a signal.
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if number:
        with contextlib.suppress(ValueError):
            return f"stopped by {SIGNAL_NAMES.get(signal.Signals(number), f'signal {number}')}"
    return f"exited with status {returncode}"


class SandboxProcess:
    """The agent process of one sandbox; :meth:`call` runs one tool request in it.

    >>> process = SandboxProcess(["python3", "-c", "..."], log_path=Path("/tmp/x.log"))
    """

    def __init__(
        self, command: list[str], *, log_path: Path, run_as: tuple[int, int] | None = None
    ) -> None:
        self._command = command
        self._log_path = log_path
        self._run_as = run_as
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        self.restarts = 0
        self.calls_in_flight = 0

    @property
    def running(self) -> bool:
        """True while the agent process is alive."""
        return self._process is not None and self._process.returncode is None

    async def warm_up(self) -> None:
        """Start the process now rather than on the first call (errors show on that call)."""
        async with self._lock:
            with contextlib.suppress(SandboxUnavailableError):
                await self._ensure_started()

    async def call(
        self, tool: str, arguments: dict[str, Any], *, time_limit: float
    ) -> CallToolResult:
        """Run ``tool`` in the sandbox; a call past ``time_limit`` seconds is stopped."""
        self.calls_in_flight += 1
        try:
            async with self._lock:
                return await self._call(tool, arguments, time_limit)
        finally:
            self.calls_in_flight -= 1

    async def _call(
        self, tool: str, arguments: dict[str, Any], time_limit: float
    ) -> CallToolResult:
        process = await self._ensure_started()
        assert process.stdin is not None and process.stdout is not None
        self._next_id += 1
        request = {"id": self._next_id, "tool": tool, "arguments": arguments, "timeout": time_limit}
        try:
            process.stdin.write((json.dumps(request) + "\n").encode())
            await process.stdin.drain()
            line = await asyncio.wait_for(process.stdout.readline(), time_limit + GRACE_SECONDS)
        except TimeoutError:
            await self._kill()
            return self._lost(f"the call ran past its time limit of {time_limit:g} s")
        except (ConnectionError, ValueError):
            line = b""
        if not line:
            returncode = await self._kill()
            return self._lost(f"the sandbox process {_death_reason(returncode)}")
        try:
            reply = json.loads(line)
            if reply.get("id") != self._next_id:
                raise ValueError("reply to another request")
            return CallToolResult.model_validate(reply["result"])
        except (ValueError, KeyError, TypeError, AttributeError):
            await self._kill()
            return self._lost("the sandbox process sent a malformed reply")

    async def stop(self) -> None:
        """Kill the process and everything in its sandbox, even in the middle of a call."""
        await self._kill()

    def _lost(self, reason: str) -> CallToolResult:
        self.restarts += 1
        return CallToolResult.from_text(
            stderr=(
                f"{reason}; its processes were stopped and the interpreter state (variables, "
                "imports) was lost. Files in the workspace are kept; the next call starts a "
                "fresh interpreter.\n"
            ),
            is_error=True,
        )

    async def halt(self) -> None:
        """Kill the process and everything in its sandbox (the protocol's ``stop``); unlike
        :meth:`stop`, the next call starts a fresh process."""
        async with self._lock:
            await self._kill()

    async def _ensure_started(self) -> asyncio.subprocess.Process:
        if self._process is not None and self._process.returncode is None:
            return self._process
        extra: dict[str, Any] = {}
        if self._run_as is not None:
            extra = {"user": self._run_as[0], "group": self._run_as[1], "extra_groups": []}
        log = os.open(self._log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            process = await asyncio.create_subprocess_exec(
                *self._command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                limit=REPLY_LIMIT_BYTES,
                **extra,
            )
        finally:
            os.close(log)
        self._process = process
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT_SECONDS)
            ready = json.loads(line).get("ready") if line else False
        except (TimeoutError, ValueError):
            ready = False
        if not ready:
            await self._kill()
            raise SandboxUnavailableError(
                f"the sandbox process did not start: {self._log_tail() or 'no output'}"
            )
        return process

    async def _kill(self) -> int:
        process, self._process = self._process, None
        if process is None:
            return 0
        if process.returncode is None:
            # bwrap leads its own session; killing the group ends the sandbox's PID namespace.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        returncode = await process.wait()
        if process.stdin is not None:
            process.stdin.close()
        return returncode

    def _log_tail(self) -> str:
        try:
            with open(self._log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 2000))
                return log.read().decode(errors="replace").strip()
        except OSError:
            return ""


__all__ = ["GRACE_SECONDS", "SandboxProcess"]
