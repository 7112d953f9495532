"""The program that runs *inside* a sandbox and executes its tools.

It uses the standard library only, because the sandbox sees the system's Python and nothing
of ours: the server passes this file's source with ``python3 -I -c``. It reads one JSON
request per line from stdin and writes one JSON reply per line to stdout::

    -> {"id": 1, "tool": "run_ipython_cell", "arguments": {"code": "x = 1"}, "timeout": 30}
    <- {"id": 1, "result": {"content": [...], "isError": false}}

In a reply, ``{``, ``[`` and ``,`` appear only as its structure (texts escape theirs), and
each text holds at most the output limit: the server refuses a reply with more values or
parts than that (see ``process.py``), since sandbox code can write on the reply pipe too.

Python cells run in one namespace kept between requests, so state persists. Output of a
cell (Python's and its child processes') is captured in memory files, a shell command's read
from pipes as it comes. After every call, every other process of the sandbox is killed (but
PID 1, the agent's parent, which only reaps orphans and cannot be traced): nothing keeps
running between calls.

The filesystem tools behave like the MCP filesystem server AgentScope's ``filesystem``
sandbox runs (same names, arguments and result texts), with ``/workspace`` as the one allowed
directory: every path is resolved (symbolic links too) and refused if it leaves it.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import fcntl
import fnmatch
import io
import json
import math
import os
import resource
import selectors
import signal
import stat
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from typing import IO, Any, BinaryIO, cast

WORKSPACE = "/workspace"
STRAY_KILL_SECONDS = 2.0
PR_SET_DUMPABLE = 4
F_GETPIPE_SZ = 1032
# A command's output is read in chunks of a pipe's default size; while a process it left
# behind holds its pipes open, the agent looks this often whether the command exited.
PIPE_CHUNK_BYTES = 64 * 1024
EXIT_POLL_SECONDS = 0.1
# Room past the output limit for the notes a tool adds to a text (truncation, time limit).
NOTE_CHARS = 1024
MAX_TREE_ENTRIES = 10_000
MAX_TREE_DEPTH = 64
MAX_SEARCH_ENTRIES = 100_000
FILE_TOOLS = (
    "read_file",
    "read_multiple_files",
    "write_file",
    "edit_file",
    "create_directory",
    "list_directory",
    "directory_tree",
    "move_file",
    "search_files",
    "get_file_info",
    "list_allowed_directories",
)


class CellLimitError(Exception):
    """Raised inside a Python cell when it runs past its wall-clock or CPU time limit."""


class ToolFailure(Exception):
    """A tool failed in a way the caller should read (reported as ``isError``)."""


def result(
    stdout: str = "", stderr: str = "", returncode: int | None = None, is_error: bool = False
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": stdout, "description": "stdout"}]
    if stderr:
        content.append({"type": "text", "text": stderr, "description": "stderr"})
    if returncode is not None:
        content.append({"type": "text", "text": str(returncode), "description": "returncode"})
    return {
        "meta": None,
        "content": content,
        "structuredContent": None,
        "isError": is_error,
    }


def limit_text(text: str, max_output: int) -> str:
    """``text``, or its first ``max_output`` characters and a note when it is longer (past
    the room for notes).

    >>> limit_text("x" * 5000, 10)
    'xxxxxxxxxx\\n[output truncated: 5000 characters in total]\\n'
    """
    if len(text) <= max_output + NOTE_CHARS:
        return text
    return f"{text[:max_output]}\n[output truncated: {len(text)} characters in total]\n"


def encode_line(message: Any) -> bytes:
    """``message`` as one JSON line in which ``{``, ``[`` and ``,`` are only its structure.

    >>> line = encode_line({"text": "[1, 2]"})
    >>> line.count(b"["), line.count(b","), json.loads(line)
    (0, 0, {'text': '[1, 2]'})
    """
    return (_json(message) + "\n").encode()


def _json(value: Any) -> str:
    if isinstance(value, str):
        # Inside a JSON string these characters are never part of an escape.
        text = json.dumps(value)
        return text.replace("{", "\\u007b").replace("[", "\\u005b").replace(",", "\\u002c")
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json(str(k))}:{_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_json(item) for item in value) + "]"
    return json.dumps(value)


def text_result(text: str, is_error: bool = False) -> dict[str, Any]:
    """A result with one text part, as an MCP server's tools return it (described as
    ``stderr`` for an error, ``stdout`` otherwise, like the other tools' parts)."""
    description = "stderr" if is_error else "stdout"
    return {
        "meta": None,
        "content": [{"type": "text", "text": text, "description": description}],
        "structuredContent": None,
        "isError": is_error,
    }


def _inside(full: str) -> bool:
    return full == WORKSPACE or full.startswith(WORKSPACE + "/")


def workspace_path(path: str, *, follow_last: bool = True) -> str:
    """The absolute path of ``path`` (relative to the workspace, or absolute under it),
    resolved, which must stay inside the workspace.

    With ``follow_last`` false a final symbolic link is the link itself (to move it).
    """
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        path = path[len(WORKSPACE) :].lstrip("/")
    if os.path.isabs(path):
        raise ToolFailure(f"{path!r} is not a path relative to the workspace")
    joined = os.path.normpath(os.path.join(WORKSPACE, path or "."))
    if follow_last or joined == WORKSPACE:
        full = os.path.realpath(joined)
    else:
        full = os.path.join(os.path.realpath(os.path.dirname(joined)), os.path.basename(joined))
    if not _inside(full):
        raise ToolFailure(f"{path!r} is outside the workspace ({WORKSPACE}, the allowed directory)")
    return full


stat_is_dir = stat.S_ISDIR
stat_is_file = stat.S_ISREG


def _os_error(exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    if exc.filename and exc.filename2:  # a move: either path may be the one missing
        return f"{reason}: {exc.filename} -> {exc.filename2}"
    return f"{reason}: {exc.filename}" if exc.filename else reason


def _open_file(full: str, path: str, flags: int, mode: str) -> IO[Any]:
    """The regular file ``full`` (``path`` as the caller gave it), opened with ``flags`` and
    ``mode``. Anything else is a ``ToolFailure`` naming ``path``, and leaves no descriptor open:
    a descriptor left behind on each failure would use up the agent's limit."""
    try:
        fd = os.open(full, flags, 0o644)
    except IsADirectoryError:
        raise ToolFailure(f"{path!r} is a directory, not a file") from None
    try:
        kind = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(kind):
        os.close(fd)
        if stat.S_ISDIR(kind):
            raise ToolFailure(f"{path!r} is a directory, not a file")
        raise ToolFailure(f"{path!r} is not a regular file")
    try:
        return open(fd, mode, encoding=None if "b" in mode else "utf-8")
    except BaseException:
        os.close(fd)
        raise


def _iso(timestamp: float) -> str:
    # The system Python in the sandbox may predate datetime.UTC.
    moment = datetime.fromtimestamp(timestamp, timezone.utc)  # noqa: UP017
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def apply_edit(content: str, old: str, new: str) -> str | None:
    """``content`` with ``old`` replaced by ``new``: the first exact occurrence, else the
    first run of lines equal to ``old``'s but for indentation (the new lines then take the
    indentation of the lines they replace). None when ``old`` is not there."""
    if old in content:
        return content.replace(old, new, 1)
    old_lines = old.split("\n")
    lines = content.split("\n")
    for start in range(len(lines) - len(old_lines) + 1):
        window = lines[start : start + len(old_lines)]
        if all(a.strip() == b.strip() for a, b in zip(old_lines, window, strict=True)):
            base = _indent(window[0])
            replaced = []
            for index, line in enumerate(new.split("\n")):
                if index == 0:
                    replaced.append(base + line.lstrip())
                    continue
                old_indent = _indent(old_lines[min(index, len(old_lines) - 1)])
                extra = max(0, len(_indent(line)) - len(old_indent))
                replaced.append(base + " " * extra + line.lstrip())
            lines[start : start + len(old_lines)] = replaced
            return "\n".join(lines)
    return None


def unified_diff(before: str, after: str, path: str) -> str:
    """A git-style diff of two texts of ``path``, fenced as a Markdown ``diff`` block."""
    lines = difflib.unified_diff(
        before.splitlines(),
        after.splitlines(),
        fromfile=path,
        tofile=path,
        fromfiledate="original",
        tofiledate="modified",
        lineterm="",
    )
    diff = "\n".join(lines) + "\n"
    fence = "```"
    while fence in diff:
        fence += "`"
    return f"{fence}diff\n{diff}{fence}\n\n"


def excluded(relative: str, patterns: list[str]) -> bool:
    """True when ``relative`` (a path under the searched directory) matches a pattern: a
    glob, or a plain name that is one of the path's components."""
    parts = relative.split("/")
    for pattern in patterns:
        if any(char in pattern for char in "*?["):
            if fnmatch.fnmatchcase(relative, pattern) or fnmatch.fnmatchcase(parts[-1], pattern):
                return True
        elif pattern.strip("/") in parts:
            return True
    return False


def captured_text(head: bytes, size: int, max_output: int) -> str:
    """The text of an output of ``size`` bytes whose first bytes are ``head``, with a note
    when it was longer than ``max_output``.

    >>> captured_text(b"abc", 5000, 3)
    'abc\\n[output truncated: 5000 bytes in total]\\n'
    """
    text = head.decode("utf-8", errors="replace")
    if size > max_output:
        text += f"\n[output truncated: {size} bytes in total]\n"
    return text


class PipeOutput:
    """What a command writes on one pipe: its first ``max_output`` bytes, and its size."""

    def __init__(self, max_output: int) -> None:
        self.max_output = max_output
        self.head = bytearray()
        self.size = 0

    def add(self, chunk: bytes) -> None:
        self.head += chunk[: max(0, self.max_output - len(self.head))]
        self.size += len(chunk)

    def text(self) -> str:
        return captured_text(bytes(self.head), self.size, self.max_output)


class CappedWriter(io.RawIOBase):
    """Python's writes on descriptor ``fd`` (a memory file of the capture) while it holds
    less than ``max_output`` bytes; the rest is only counted, so a cell printing more than
    a file may hold runs on (its print would fail at the file size limit)."""

    def __init__(self, fd: int, max_output: int) -> None:
        self.fd = fd
        self.name = fd  # as io.FileIO names a descriptor it opened
        self.max_output = max_output
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        room = max(0, self.max_output - os.fstat(self.fd).st_size)
        kept = view[:room]
        while kept:
            kept = kept[os.write(self.fd, kept) :]
        self.dropped += len(view) - len(view[:room])
        return len(view)


class CaptureLost(Exception):
    """The capture's descriptors were closed or replaced by the sandbox's code: the agent
    exits, and the server starts a fresh one."""


class Capture:
    """Points file descriptors 1 and 2 (and ``sys.stdout``/``sys.stderr``) at memory files.

    Its descriptors are opened once, for the agent's life: a call that used up every file
    descriptor the limit allows still has its output read, and the next call can free them.
    """

    def __init__(self, max_output: int) -> None:
        self.max_output = max_output
        self.fds = (os.memfd_create("stdout"), os.memfd_create("stderr"))
        self.null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        self.files = self._files()
        self.writers = (CappedWriter(1, max_output), CappedWriter(2, max_output))
        self.streams = (_text_stream(self.writers[0]), _text_stream(self.writers[1]))
        # Streams the sandbox's code closed, kept: a thread may still be printing on one.
        self.retired: list[io.TextIOWrapper] = []

    def _files(self) -> list[tuple[int, int]]:
        try:
            return [(info.st_dev, info.st_ino) for info in map(os.fstat, (*self.fds, self.null))]
        except OSError as exc:
            raise CaptureLost(exc) from None

    def clear(self) -> None:
        """Empty the memory files (for a new call, or to free the memory they hold)."""
        if self._files() != self.files:
            raise CaptureLost("the output capture's descriptors were closed")
        for fd in self.fds:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        for writer in self.writers:
            writer.dropped = 0

    def __enter__(self) -> Capture:
        self.clear()
        for target, fd in zip((1, 2), self.fds, strict=True):
            os.dup2(fd, target)
        self._set_streams()
        return self

    def __exit__(self, *exc: object) -> None:
        for target in (1, 2):
            os.dup2(self.null, target)
        self._set_streams()  # between calls they write where 1 and 2 lead: nowhere

    def _set_streams(self) -> None:
        """``sys.stdout`` and ``sys.stderr`` as the capture's streams: the same from call to
        call (one the code closed made anew). Never dropped: Python's ``print`` holds no
        reference to the stream it writes on, so a thread printing on a stream freed under
        it crashed the interpreter."""
        if any(stream.closed for stream in self.streams):
            self.retired += self.streams
            self.writers = (CappedWriter(1, self.max_output), CappedWriter(2, self.max_output))
            self.streams = (_text_stream(self.writers[0]), _text_stream(self.writers[1]))
        sys.stdout, sys.stderr = self.streams

    def read(self, index: int) -> str:
        fd = self.fds[index]
        size = os.fstat(fd).st_size
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        remaining = min(size, self.max_output)
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return captured_text(b"".join(chunks), size + self.writers[index].dropped, self.max_output)


def _text_stream(raw: io.RawIOBase) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        cast(BinaryIO, raw),
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )


def _on_limit(signum: int, frame: object) -> None:
    limit = "wall-clock" if signum == signal.SIGALRM else "CPU"
    raise CellLimitError(f"the cell ran past its {limit} time limit")


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Agent:
    """Executes tool requests; one instance per sandbox process."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.max_output = int(config["max_output"])
        self.cpu_seconds = int(config["cpu_seconds"])
        self.shell_prefix = [str(part) for part in config["shell_prefix"]]
        self.pid = os.getpid()
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        self.requests: BinaryIO = os.fdopen(os.dup(0), "rb")
        self.replies = os.dup(1)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = _text_stream(io.FileIO(1, "w", closefd=False))
        sys.stderr = _text_stream(io.FileIO(2, "w", closefd=False))
        self.capture = Capture(self.max_output)
        # A write past the file-size limit fails with EFBIG instead of killing the process.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        signal.signal(signal.SIGALRM, _on_limit)
        signal.signal(signal.SIGXCPU, _on_limit)
        if WORKSPACE not in sys.path:
            sys.path.insert(0, WORKSPACE)

    def serve(self) -> None:
        self.send({"ready": True, "python": sys.version.split()[0]})
        for line in self.requests:
            request = json.loads(line)
            try:
                reply = self.handle(request["tool"], request.get("arguments") or {}, request)
            finally:
                self.stop_strays()
            for part in reply["content"]:
                part["text"] = limit_text(part["text"], self.max_output)
            self.send({"id": request["id"], "result": reply})

    def send(self, message: dict[str, Any]) -> None:
        data = encode_line(message)
        while data:
            data = data[os.write(self.replies, data) :]

    def handle(self, tool: str, arguments: dict[str, Any], request: dict[str, Any]) -> Any:
        timeout = float(request.get("timeout") or 60)
        if tool in FILE_TOOLS:
            return self.file_tool(tool, arguments)
        try:
            if tool == "run_ipython_cell":
                return self.run_cell(str(arguments["code"]), timeout)
            if tool == "run_shell_command":
                return self.run_shell(str(arguments["command"]), timeout)
            return result(stderr=f"unknown tool {tool!r}\n", is_error=True)
        except ToolFailure as exc:
            return result(stderr=f"{tool}: {exc}\n", is_error=True)
        except OSError as exc:
            return result(stderr=f"{tool}: {exc.strerror or exc}\n", is_error=True)
        except ValueError as exc:
            return result(stderr=f"{tool}: {exc}\n", is_error=True)

    def run_cell(self, code: str, timeout: float) -> dict[str, Any]:
        capture = self.capture
        failed = False
        try:
            with capture:
                failed = not self.execute(code, timeout)
            return result(capture.read(0), capture.read(1), is_error=failed)
        finally:
            capture.clear()

    def renew_cpu_budget(self) -> None:
        """Each call gets the CPU budget anew; the hard limit caps the interpreter's lifetime."""
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        # Whole seconds: rounded down, a cell started at 4.9 s used would get 1.1 s of 2.
        soft = math.ceil(_cpu_used()) + self.cpu_seconds
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))

    def execute(self, code: str, timeout: float) -> bool:
        """Run a cell; print the value of a final expression. False when it raised."""
        os.chdir(WORKSPACE)
        self.renew_cpu_budget()
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            tree = ast.parse(code, "<cell>", "exec")
            last = tree.body[-1] if tree.body else None
            if isinstance(last, ast.Expr):
                tree.body.pop()
            # Running the caller's code is this program's purpose; the sandbox contains it.
            exec(compile(tree, "<cell>", "exec"), self.namespace)  # noqa: S102
            if isinstance(last, ast.Expr):
                expression = compile(ast.Expression(last.value), "<cell>", "eval")
                value = eval(expression, self.namespace)  # noqa: S307
                if value is not None:
                    self.namespace["_"] = value
                    print(repr(value))
            return True
        except CellLimitError as exc:
            sys.stderr.write(f"TimeoutError: {exc} and was interrupted; what it defined is kept\n")
            return False
        except SyntaxError as exc:
            sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
            return False
        except BaseException as exc:
            tb = exc.__traceback__.tb_next if exc.__traceback__ else None
            sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))
            return False
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout.flush()
            sys.stderr.flush()
            if os.getpid() != self.pid:
                # A process the cell forked must never come back to serve requests.
                os._exit(0)

    def run_shell(self, command: str, timeout: float) -> dict[str, Any]:
        # Pipes, not the memory files of cells: a command may print more than the file size
        # limit lets a file hold, and only the first max_output bytes of it are kept.
        self.renew_cpu_budget()  # reading a flood of output takes the agent's CPU too
        process = subprocess.Popen(
            [*self.shell_prefix, "/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=WORKSPACE,
            start_new_session=True,
        )
        assert process.stdout is not None and process.stderr is not None
        stdout, stderr = PipeOutput(self.max_output), PipeOutput(self.max_output)
        outputs = {process.stdout.fileno(): stdout, process.stderr.fileno(): stderr}
        with process.stdout, process.stderr:
            returncode, note = self.read_outputs(process, outputs, timeout)
        return result(stdout.text(), stderr.text() + note, returncode, is_error=returncode != 0)

    @staticmethod
    def read_outputs(
        process: subprocess.Popen[bytes], outputs: dict[int, PipeOutput], timeout: float
    ) -> tuple[int, str]:
        """Read the pipes of ``process`` into ``outputs`` until it exits (killed once past
        ``timeout`` seconds), then what they hold: its return code and a note of a kill."""
        deadline = time.monotonic() + timeout
        note = ""
        with selectors.DefaultSelector() as selector:
            for fd in outputs:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map() and process.poll() is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for key, _ in selector.select(min(remaining, EXIT_POLL_SECONDS)):
                    chunk = os.read(key.fd, PIPE_CHUNK_BYTES)
                    if chunk:
                        outputs[key.fd].add(chunk)
                    else:
                        selector.unregister(key.fd)
            try:
                returncode = process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                returncode = process.wait()
                note = f"\n[the command ran past its time limit of {timeout:g} s and was killed]\n"
            # What the pipes hold now: a process left behind writing on does not hold the call.
            for key in list(selector.get_map().values()):
                fd = key.fd
                os.set_blocking(fd, False)
                left = fcntl.fcntl(fd, F_GETPIPE_SZ)
                with contextlib.suppress(BlockingIOError):
                    while left > 0 and (chunk := os.read(fd, min(left, PIPE_CHUNK_BYTES))):
                        outputs[fd].add(chunk)
                        left -= len(chunk)
        return returncode, note

    def file_tool(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run a filesystem tool: its text, or ``Error: ...`` with ``isError`` set."""
        method: Callable[..., str] = getattr(self, tool)
        try:
            return text_result(method(**arguments))
        except ToolFailure as exc:
            return text_result(f"Error: {exc}", is_error=True)
        except OSError as exc:
            return text_result(f"Error: {_os_error(exc)}", is_error=True)
        except (ValueError, TypeError, RecursionError) as exc:
            return text_result(f"Error: {exc}", is_error=True)

    def _read_text(self, path: str, limit: int | None = None) -> str:
        limit = self.max_output if limit is None else limit
        # Non-blocking, so a FIFO the sandbox made cannot hang the call; only files are read.
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
        with _open_file(workspace_path(path), path, flags, "rb") as file:
            data: bytes = file.read(limit + 1)
        if len(data) > limit:
            raise ToolFailure(f"{path!r} is larger than {limit} bytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolFailure(f"{path!r} is not UTF-8 text") from None

    @staticmethod
    def _write_text(full: str, path: str, content: str) -> None:
        # Encoded before the file is emptied: text UTF-8 cannot hold (a lone surrogate)
        # fails the write with the file as it was.
        data = content.encode("utf-8")
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
        with _open_file(full, path, flags, "wb") as file:
            os.set_blocking(file.fileno(), True)
            file.truncate(0)
            file.write(data)

    def read_file(self, path: str) -> str:
        return self._read_text(path)

    def read_multiple_files(self, paths: list[str]) -> str:
        pieces = []
        budget = self.max_output
        for path in paths:
            try:
                if budget <= 0:
                    raise ToolFailure("not read: the output limit is reached")
                content = self._read_text(path, budget)
                budget -= len(content.encode())
                pieces.append(f"{path}:\n{content}\n")
            except ToolFailure as exc:
                pieces.append(f"{path}: Error - {exc}")
            except OSError as exc:
                pieces.append(f"{path}: Error - {_os_error(exc)}")
        return "\n---\n".join(pieces)

    def write_file(self, path: str, content: str) -> str:
        if path.endswith("/"):  # a folder's path: made a file of that name, the / dropped
            raise ToolFailure(f"{path!r} is a directory's path, not a file's")
        full = workspace_path(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        self._write_text(full, path, content)
        return f"Successfully wrote to {path}"

    def edit_file(self, path: str, edits: list[dict[str, str]], dryRun: bool = False) -> str:
        full = workspace_path(path)
        original = self._read_text(path).replace("\r\n", "\n")
        modified = original
        for edit in edits:
            old = edit["oldText"].replace("\r\n", "\n")
            changed = apply_edit(modified, old, edit["newText"].replace("\r\n", "\n"))
            if changed is None:
                raise ToolFailure(f"Could not find exact match for edit:\n{edit['oldText']}")
            modified = changed
        if not dryRun:
            self._write_text(full, path, modified)
        return unified_diff(original, modified, path)

    def create_directory(self, path: str) -> str:
        os.makedirs(workspace_path(path), exist_ok=True)
        return f"Successfully created directory {path}"

    def list_directory(self, path: str = ".") -> str:
        with os.scandir(workspace_path(path)) as entries:
            return "\n".join(
                f"{'[DIR]' if entry.is_dir(follow_symlinks=False) else '[FILE]'} {entry.name}"
                for entry in sorted(entries, key=lambda e: e.name)
            )

    def directory_tree(self, path: str) -> str:
        counted = [0]

        def walk(directory: str, depth: int) -> list[dict[str, Any]]:
            if depth > MAX_TREE_DEPTH:
                raise ToolFailure(f"the tree is deeper than {MAX_TREE_DEPTH} levels")
            tree = []
            with os.scandir(directory) as entries:
                for entry in sorted(entries, key=lambda e: e.name):
                    counted[0] += 1
                    if counted[0] > MAX_TREE_ENTRIES:
                        raise ToolFailure(f"the tree has more than {MAX_TREE_ENTRIES} entries")
                    if entry.is_dir(follow_symlinks=False):
                        children = walk(entry.path, depth + 1)
                        tree.append({"name": entry.name, "type": "directory", "children": children})
                    else:
                        tree.append({"name": entry.name, "type": "file"})
            return tree

        # Names as text (as the MCP server's JSON has them), not escapes: a name that is not
        # UTF-8 then reaches the client as U+FFFD, like in the other tools' texts.
        text = json.dumps(walk(workspace_path(path), 0), indent=2, ensure_ascii=False)
        if len(text) > self.max_output:
            raise ToolFailure(f"the tree is larger than {self.max_output} bytes")
        return text

    def move_file(self, source: str, destination: str) -> str:
        origin = workspace_path(source, follow_last=False)
        target = workspace_path(destination, follow_last=False)
        if WORKSPACE in (origin, target):
            raise ToolFailure(f"{WORKSPACE} itself cannot be moved or replaced")
        if os.path.lexists(target):
            raise ToolFailure(f"destination {destination!r} already exists")
        os.rename(origin, target)
        return f"Successfully moved {source} to {destination}"

    def search_files(self, path: str, pattern: str, excludePatterns: list[str]) -> str:
        root = workspace_path(path)
        needle = pattern.lower()
        found: list[str] = []
        seen = 0
        size = 0
        for directory, dirnames, filenames in os.walk(root):
            dirnames.sort()
            relative_dir = os.path.relpath(directory, root)
            for name in sorted(dirnames + filenames):
                seen += 1
                if seen > MAX_SEARCH_ENTRIES:
                    raise ToolFailure(f"searched more than {MAX_SEARCH_ENTRIES} entries")
                relative = os.path.normpath(os.path.join(relative_dir, name))
                if excluded(relative, excludePatterns):
                    if name in dirnames:
                        dirnames.remove(name)
                    continue
                if needle in name.lower():
                    match = os.path.join(directory, name)
                    size += len(match) + 1
                    if size > self.max_output:
                        raise ToolFailure(f"the matches are longer than {self.max_output} bytes")
                    found.append(match)
        return "\n".join(found) if found else "No matches found"

    def get_file_info(self, path: str) -> str:
        info = os.stat(workspace_path(path))
        facts = {
            "size": info.st_size,
            "created": _iso(info.st_ctime),
            "modified": _iso(info.st_mtime),
            "accessed": _iso(info.st_atime),
            "isDirectory": str(stat_is_dir(info.st_mode)).lower(),
            "isFile": str(stat_is_file(info.st_mode)).lower(),
            "permissions": format(info.st_mode & 0o777, "o"),
        }
        return "\n".join(f"{key}: {value}" for key, value in facts.items())

    def list_allowed_directories(self) -> str:
        return f"Allowed directories:\n{WORKSPACE}"

    def stop_strays(self) -> None:
        """Kill every process of the sandbox but this one (and PID 1, which reaps them)."""
        deadline = time.monotonic() + STRAY_KILL_SECONDS
        while time.monotonic() < deadline:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                return
            self.reap()
            time.sleep(0.001)

    @staticmethod
    def reap() -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return


def reap_as_init() -> None:
    """As PID 1 of the sandbox, fork: the child returns to serve requests, and this process
    reaps each orphan of the sandbox as it exits until the child exits, then exits as it did.

    PID 1 outlives the kill of every other process after a call, so it is not dumpable:
    sandbox code (the same uid) can neither trace it nor write its memory to run its own.
    """
    if os.getpid() != 1:
        return
    try:
        import ctypes
    except ImportError:  # a minimal Python: the agent stays PID 1 and reaps after each call
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "the sandbox's PID 1 cannot be made undumpable")
    child = os.fork()
    if child == 0:
        libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        return
    # The server reads the end of the agent's replies once the agent is gone.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    while True:
        pid, status = os.wait()
        if pid == child:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.WEXITSTATUS(status))


def main() -> None:
    reap_as_init()
    Agent(json.loads(sys.argv[1])).serve()


if __name__ == "__main__":
    main()
