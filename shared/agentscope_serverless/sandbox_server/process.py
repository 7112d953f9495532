"""One confined agent process per sandbox, driven over its stdin/stdout one JSON line at a time.

The process starts on demand and starts again after it dies (a limit killed it, a call ran
past its time): the sandbox, its workspace and its place in the session mapping stay; only
the Python variables are lost, and the call that lost them says so.

What the agent replies is the sandbox's to forge: its cells run in the agent's interpreter,
which holds the reply pipe. So a reply is read within the bounds of what the agent sends (a
line of :func:`reply_limit` bytes, a small structure, three parts labelled as the agent
labels them, texts of ``max_output`` characters), which keep what reading it costs the
server small, and any other is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import signal
from collections.abc import Callable
from typing import Any, BinaryIO

from agentscope_serverless.errors import (
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxUnavailableError,
)
from agentscope_serverless.sandbox_protocol import CallToolResult
from agentscope_serverless.sandbox_server.agent import limit_text
from agentscope_serverless.sandbox_server.isolation import BWRAP_ENVIRONMENT, JAIL_FDS, JailCommand
from agentscope_serverless.sandbox_server.jail import SANDBOX_OOM_SCORE_ADJ, SandboxCgroup

logger = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 15.0
# Time the agent gets past a call's own limit to report it, before the process is killed.
GRACE_SECONDS = 3.0
# Room in a reply line past its texts: ids, field names, the notes a tool adds to its output.
REPLY_ENVELOPE_BYTES = 64 * 1024
# Brackets and commas of a reply line; the agent escapes those of its texts, and its replies
# need 18 at most. Parsing a line costs little per byte, and much per value it holds.
MAX_REPLY_STRUCTURE = 64
STRUCTURE = (b"{", b"[", b",")
# stdout, stderr and a return code.
MAX_REPLY_PARTS = 3
# What the agent labels its parts with: any other label is text of the sandbox's choosing.
PART_DESCRIPTIONS = frozenset({"stdout", "stderr", "returncode"})
# The smallest pipe buffer asked for bwrap's options and files (the kernel's is 64 KiB).
PIPE_MIN_BYTES = 64 * 1024
# How long a stop waits for the killed bwrap to be reaped (it dies with its PID namespace).
STOP_WAIT_SECONDS = 2.0
# Joins the cgroups named before ``--`` (as root, before anything runs), then runs the rest.
# Run before the jail (as the server's uid): make the OOM killer choose the sandbox first,
# join its cgroups (the procs files up to "--"), then run the rest.
JAIL_ENTRY = (
    f"echo {SANDBOX_OOM_SCORE_ADJ} > /proc/self/oom_score_adj || exit 125; "
    'for f; do shift; [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; done; exec "$@"'
)

LONE_SURROGATE = re.compile("[\ud800-\udfff]")

CommandFactory = Callable[[tuple[int, ...]], JailCommand]
SIGNAL_NAMES = {
    signal.SIGXCPU: "its CPU time limit",
    signal.SIGKILL: "a kill signal (a time or memory limit)",
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGXFSZ: "its file size limit",
}


def _valid_unicode(value: Any) -> Any:
    """``value`` with every lone surrogate in its texts and keys replaced by U+FFFD.

    JSON lets the sandbox send one (``"\\udcff"``): Python names a file whose name is not
    UTF-8 with one per undecodable byte, and the reply could not be encoded for the client.

    >>> _valid_unicode({"text": "caf\\udce9"})
    {'text': 'caf\ufffd'}
    """
    if isinstance(value, str):
        return value if value.isascii() else LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_valid_unicode(item) for item in value]
    if isinstance(value, dict):
        return {_valid_unicode(key): _valid_unicode(item) for key, item in value.items()}
    return value


def reply_limit(max_output: int) -> int:
    """The length of the longest reply line of an agent whose texts hold ``max_output`` bytes
    of output each: JSON takes at most 6 bytes for a byte of output (``\\ufffd`` for one that
    is not UTF-8) and 12 for a character (``\\ud83d\\ude42``), and a reply holds two texts of
    output (stdout, stderr) or one text of ``max_output`` characters.

    >>> reply_limit(1024**2) // 1024**2
    12
    """
    return 12 * max_output + REPLY_ENVELOPE_BYTES


def _death_reason(returncode: int) -> str:
    # bwrap exits with 128 + signal when the program it runs dies of a signal.
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if number:
        with contextlib.suppress(ValueError):
            return f"stopped by {SIGNAL_NAMES.get(signal.Signals(number), f'signal {number}')}"
    return f"exited with status {returncode}"


class _Halted(Exception):
    """The sandbox was halted while its process started."""


class SandboxProcess:
    """The agent process of one sandbox; :meth:`call` runs one tool request in it.

    ``command`` makes the bwrap command for the descriptors its options and files are read
    from; each text of a result holds at most ``max_output`` characters. With a ``cgroup``,
    every process of the sandbox starts inside it, is frozen between calls and killed with
    it; ``setpriv`` (as root) drops to ``run_as`` after joining the cgroup.
    """

    def __init__(
        self,
        command: CommandFactory,
        *,
        max_output: int,
        run_as: tuple[int, int] | None = None,
        cgroup: SandboxCgroup | None = None,
        setpriv: str | None = None,
        freeze: bool = True,
    ) -> None:
        self._command = command
        self._max_output = max_output
        self._reply_limit = reply_limit(max_output)
        self._run_as = run_as
        self._cgroup = cgroup
        self._setpriv = setpriv
        self._freezes = freeze
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._closed = False
        # Counts halts: a call that began before one is refused, or ended, by it.
        self._halts = 0
        self.restarts = 0
        self.calls_in_flight = 0

    @property
    def running(self) -> bool:
        """True while the agent process is alive."""
        return self._process is not None and self._process.returncode is None

    @property
    def released(self) -> bool:
        """True once :meth:`stop` was called: no process starts for this sandbox again."""
        return self._closed

    @property
    def frozen(self) -> bool:
        """True while the sandbox's processes are frozen (between calls)."""
        return self._cgroup is not None and self._cgroup.frozen

    async def warm_up(self) -> None:
        """Start the process now rather than on the first call (errors show on that call)."""
        async with self._lock:
            with contextlib.suppress(SandboxUnavailableError, SandboxNotFoundError, _Halted):
                self._thaw()
                try:
                    await self._ensure_started()
                finally:
                    self._freeze()

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        time_limit: float,
        client_left: asyncio.Event | None = None,
    ) -> CallToolResult:
        """Run ``tool`` in the sandbox; a call past ``time_limit`` seconds is stopped.

        Calls on one sandbox run one at a time: a call waits for its turn ``time_limit``
        seconds at most, and until ``client_left`` is set; past either it is not run, and
        raises :class:`SandboxUnavailableError` saying so. Once ``client_left`` is set a
        running call is ended too, as a :meth:`halt` ends it but leaving the calls after it
        their turn. A :meth:`halt` ends the call, or refuses it if it has not begun.
        """
        self.calls_in_flight += 1
        try:
            halts = self._halts
            await self._take_turn(time_limit, client_left)
            try:
                if self._closed:
                    raise SandboxNotFoundError("the sandbox was released")
                if self._halts != halts:
                    raise SandboxRequestError(
                        "the sandbox was stopped while this call waited for its turn: the "
                        "call was not run (start the sandbox to run calls again)"
                    )
                try:
                    result = await self._call_while_present(
                        tool, arguments, time_limit, client_left
                    )
                except _Halted:
                    result = None
                if self._halts != halts:
                    return CallToolResult.from_text(
                        stderr="the sandbox was stopped during the call: its processes were "
                        "stopped and the interpreter state (variables, imports) was lost. "
                        "Files in the workspace are kept; start the sandbox to run calls "
                        "again.\n",
                        is_error=True,
                    )
                assert result is not None
                return result
            finally:
                self._freeze()
                self._lock.release()
        finally:
            self.calls_in_flight -= 1

    async def _take_turn(self, wait_limit: float, client_left: asyncio.Event | None) -> None:
        """Hold the sandbox once the calls before this one have ended: within ``wait_limit``
        seconds and before ``client_left`` is set, else not at all (SandboxUnavailableError).
        """
        turn = asyncio.ensure_future(self._lock.acquire())
        waits: set[asyncio.Future[Any]] = {turn}
        if client_left is not None:
            waits.add(asyncio.ensure_future(client_left.wait()))
        try:
            await asyncio.wait(waits, timeout=wait_limit, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._give_up(turn)
            raise
        finally:
            for waiting in waits - {turn}:
                waiting.cancel()
        if client_left is not None and client_left.is_set():
            self._give_up(turn)
            logger.info("a call on a sandbox was not run: its client left while it waited")
            raise SandboxUnavailableError(
                "the client left while the call waited for the calls before it on the "
                "sandbox to end: the call was not run"
            )
        if not turn.done():
            self._give_up(turn)
            raise SandboxUnavailableError(
                f"the sandbox is busy: the call waited {wait_limit:g} s (its time limit) for "
                "the calls before it on the sandbox to end, and was not run; retry once they "
                "have ended"
            )

    async def _call_while_present(
        self,
        tool: str,
        arguments: dict[str, Any],
        time_limit: float,
        client_left: asyncio.Event | None,
    ) -> CallToolResult:
        """:meth:`_call`, ended once ``client_left`` is set: nobody waits for its result, and
        what it started (a cell sleeping, a command's children) would hold the sandbox, and
        the calls queued behind it, until its time limit. Its processes are killed as a halt
        kills them, and it raises :class:`SandboxUnavailableError`."""
        if client_left is None:
            return await self._call(tool, arguments, time_limit)
        running = asyncio.ensure_future(self._call(tool, arguments, time_limit))
        left = asyncio.ensure_future(client_left.wait())
        try:
            await asyncio.wait({running, left}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            if not running.done():
                # Cancelled first: a process it is starting is never left to run the call.
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
                await self._kill()
        if not running.cancelled():
            return running.result()
        self.restarts += 1
        logger.info("a call on a sandbox was stopped: its client left while it ran")
        raise SandboxUnavailableError(
            "the client left during the call: its processes were stopped and its result "
            "dropped; the next call starts a fresh interpreter"
        )

    def _give_up(self, turn: asyncio.Future[Any]) -> None:
        """Leave the sandbox's queue: a turn given to ``turn`` meanwhile passes on."""

        def pass_on(turn: asyncio.Future[Any]) -> None:
            if not turn.cancelled() and turn.exception() is None:
                self._lock.release()

        turn.cancel()
        turn.add_done_callback(pass_on)

    def _thaw(self) -> None:
        if self._closed:
            raise SandboxNotFoundError("the sandbox was released")
        if self._cgroup is not None:
            self._cgroup.thaw()

    def _freeze(self) -> None:
        # Nothing of the sandbox runs between calls: threads, background processes, timers.
        if self._cgroup is not None and self._freezes and not self._closed:
            try:
                self._cgroup.freeze()
            except OSError:
                logger.exception("cannot freeze a sandbox between calls")

    async def _call(
        self, tool: str, arguments: dict[str, Any], time_limit: float
    ) -> CallToolResult:
        if not self.running:
            self._thaw()  # a new process must not join a frozen cgroup
        process = await self._ensure_started()
        assert process.stdin is not None and process.stdout is not None
        self._next_id += 1
        request = {"id": self._next_id, "tool": tool, "arguments": arguments, "timeout": time_limit}
        try:
            process.stdin.write((json.dumps(request) + "\n").encode())
            # Thawed once the request waits in the pipe: the agent wakes once, to read it.
            self._thaw()
            # Handing the request over counts against the time limit too: sandbox code can
            # keep the agent from reading it, and a request larger than the pipe would wait.
            line = await asyncio.wait_for(
                self._exchange(process.stdin, process.stdout), time_limit + GRACE_SECONDS
            )
        except TimeoutError:
            await self._kill()
            return self._lost(f"the call ran past its time limit of {time_limit:g} s")
        except ValueError:  # past the stream's limit: no reply of the agent is that long
            await self._kill()
            return self._lost(
                f"the sandbox process sent a reply longer than {self._reply_limit} bytes"
            )
        except ConnectionError:
            line = b""
        if not line:
            returncode = await self._kill()
            if self._closed:
                return CallToolResult.from_text(
                    stderr="the sandbox was released during the call: its processes were "
                    "stopped and its files deleted.\n",
                    is_error=True,
                )
            return self._lost(f"the sandbox process {_death_reason(returncode)}")
        try:
            return self._result(line)
        except (ValueError, KeyError, TypeError, AttributeError):
            await self._kill()
            return self._lost("the sandbox process sent a malformed reply")

    @staticmethod
    async def _exchange(requests: asyncio.StreamWriter, replies: asyncio.StreamReader) -> bytes:
        """The reply line to the request written on ``requests``, once it is handed over."""
        await requests.drain()
        return await replies.readline()

    def _result(self, line: bytes) -> CallToolResult:
        """The result a reply line holds, if the agent could have sent it (else ValueError),
        with each text cut to ``max_output`` characters."""
        if sum(map(line.count, STRUCTURE)) > MAX_REPLY_STRUCTURE:
            raise ValueError("more values than a reply holds")
        reply = json.loads(line)
        if reply.get("id") != self._next_id:
            raise ValueError("reply to another request")
        result = CallToolResult.model_validate(_valid_unicode(reply["result"]))
        if len(result.content) > MAX_REPLY_PARTS:
            raise ValueError("more parts than a reply holds")
        if any(part.description not in PART_DESCRIPTIONS for part in result.content):
            raise ValueError("a part the agent does not send")
        parts = [
            part.model_copy(update={"text": limit_text(part.text, self._max_output)})
            for part in result.content
        ]
        return CallToolResult(content=parts, isError=result.isError)

    async def stop(self) -> None:
        """Kill the process and everything in its sandbox, even in the middle of a call or
        of its start; no process starts for this sandbox afterwards."""
        self._closed = True
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
        """Kill the process and everything in its sandbox (the protocol's ``stop``), even in
        the middle of a call or of its start: that call ends saying so, and the calls
        waiting for their turn are refused. Unlike :meth:`stop`, the next call starts a
        fresh process."""
        self._halts += 1
        await self._kill()

    async def _ensure_started(self) -> asyncio.subprocess.Process:
        if self._process is not None and self._process.returncode is None:
            return self._process
        halts = self._halts
        if self._cgroup is not None:
            # Whatever a dead interpreter left behind goes before a new one starts.
            await asyncio.to_thread(self._cgroup.kill_all)
        if self._closed:
            raise SandboxNotFoundError("the sandbox was released")
        # What bwrap and the interpreter print before the agent runs: why a start failed.
        # A memory file, not one on disk: the sandbox's PID 1 starts with it as its stderr,
        # and /proc/1/fd/2 would show the sandbox the host path of a file.
        with os.fdopen(os.memfd_create("sandbox-log"), "rb") as log:
            process = await self._spawn(log.fileno())
            self._process = process
            if self.released or self._halts != halts:  # released or halted while starting
                await self._kill()
                if self.released:
                    raise SandboxNotFoundError("the sandbox was released")
                raise _Halted
            assert process.stdout is not None
            try:
                line = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT_SECONDS)
                ready = json.loads(line).get("ready") if line else False
            except (TimeoutError, ValueError):
                ready = False
            if not ready:
                await self._kill()
                if self._closed:
                    raise SandboxNotFoundError("the sandbox was released")
                if self._halts != halts:
                    raise _Halted
                raise SandboxUnavailableError(
                    f"the sandbox process did not start: {_tail(log) or 'no output'}"
                )
        return process

    async def _spawn(self, log: int) -> asyncio.subprocess.Process:
        # bwrap reads its options and small files from pipes: no host path in its cmdline.
        pipes = [os.pipe() for _ in range(JAIL_FDS)]
        readers = [reader for reader, _ in pipes]
        try:
            jail = self._command(tuple(readers))
            used = 1 + len(jail.files)
            for _, writer in pipes[used:]:
                os.close(writer)
            for (_, writer), data in zip(pipes[:used], (jail.options, *jail.files), strict=True):
                with os.fdopen(writer, "wb") as stream:
                    # Written whole before bwrap reads: the pipe must hold it (the options
                    # hold the sandbox's environment, up to 64 KiB).
                    fcntl.fcntl(writer, fcntl.F_SETPIPE_SZ, max(len(data), PIPE_MIN_BYTES))
                    stream.write(data)
            argv = list(jail.argv)
            drop: dict[str, Any] = {}
            if self._run_as is not None and self._setpriv is None:
                drop = {"user": self._run_as[0], "group": self._run_as[1], "extra_groups": []}
            elif self._run_as is not None and self._setpriv is not None:
                uid, gid = self._run_as
                argv = [
                    self._setpriv,
                    f"--reuid={uid}",
                    f"--regid={gid}",
                    "--clear-groups",
                    "--",
                    *argv,
                ]
            procs_files = [] if self._cgroup is None else self._cgroup.procs_files
            argv = ["/bin/sh", "-c", JAIL_ENTRY, "sh", *procs_files, "--", *argv]
            return await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                limit=self._reply_limit,
                pass_fds=readers[:used],
                env=dict(BWRAP_ENVIRONMENT),  # never the server's own environment
                cwd="/",
                **drop,
            )
        finally:
            for reader in readers:
                os.close(reader)

    async def _kill(self) -> int:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            # bwrap leads its own session; killing the group ends the sandbox's PID namespace.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if self._cgroup is not None:
            # Exact: every process of the cgroup, whichever session or parent it has now.
            await asyncio.to_thread(self._cgroup.kill_all)
        if process is None:
            return 0
        try:
            returncode = await asyncio.wait_for(process.wait(), STOP_WAIT_SECONDS)
        except TimeoutError:
            logger.error("a sandbox process did not exit after SIGKILL")
            returncode = -signal.SIGKILL
        if process.stdin is not None:
            process.stdin.close()
        return returncode


def _tail(log: BinaryIO) -> str:
    size = os.fstat(log.fileno()).st_size
    return os.pread(log.fileno(), 2000, max(0, size - 2000)).decode(errors="replace").strip()


__all__ = ["GRACE_SECONDS", "SandboxProcess", "reply_limit"]
