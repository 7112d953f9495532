"""The program that runs *inside* a sandbox and executes its tools.

It uses the standard library only, because the sandbox sees the system's Python and nothing
of ours: the server passes this file's source with ``python3 -I -c``. It reads one JSON
request per line from stdin and writes one JSON reply per line to stdout::

    -> {"id": 1, "tool": "run_ipython_cell", "arguments": {"code": "x = 1"}, "timeout": 30}
    <- {"id": 1, "result": {"content": [...], "isError": false}}

Python cells run in one namespace kept between requests, so state persists. Output of a
call (Python's and its child processes') is captured in memory files. After every call,
every other process of the sandbox is killed: nothing keeps running between calls.
"""

from __future__ import annotations

import ast
import io
import json
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, BinaryIO

WORKSPACE = "/workspace"
STRAY_KILL_SECONDS = 2.0


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


def workspace_path(path: str) -> str:
    """The absolute path of ``path`` (relative to the workspace), which must stay inside it."""
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        path = path[len(WORKSPACE) :].lstrip("/")
    if os.path.isabs(path):
        raise ToolFailure(f"{path!r} is not a path relative to the workspace")
    full = os.path.realpath(os.path.join(WORKSPACE, path or "."))
    if full != WORKSPACE and not full.startswith(WORKSPACE + "/"):
        raise ToolFailure(f"{path!r} is outside the workspace")
    return full


class Capture:
    """Points file descriptors 1 and 2 (and ``sys.stdout``/``sys.stderr``) at memory files."""

    def __init__(self, max_output: int) -> None:
        self.max_output = max_output
        self.fds = (os.memfd_create("stdout"), os.memfd_create("stderr"))

    def __enter__(self) -> Capture:
        for target, fd in zip((1, 2), self.fds, strict=True):
            os.dup2(fd, target)
        sys.stdout = _text_stream(1)
        sys.stderr = _text_stream(2)
        return self

    def __exit__(self, *exc: object) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        for target in (1, 2):
            os.dup2(null, target)
        os.close(null)
        sys.stdout = _text_stream(1)
        sys.stderr = _text_stream(2)

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
        text = b"".join(chunks).decode("utf-8", errors="replace")
        if size > self.max_output:
            text += f"\n[output truncated: {size} bytes in total]\n"
        return text

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _text_stream(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False),
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
        sys.stdout = _text_stream(1)
        sys.stderr = _text_stream(2)
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
            self.send({"id": request["id"], "result": reply})

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.replies, data) :]

    def handle(self, tool: str, arguments: dict[str, Any], request: dict[str, Any]) -> Any:
        timeout = float(request.get("timeout") or 60)
        try:
            if tool == "run_ipython_cell":
                return self.run_cell(str(arguments["code"]), timeout)
            if tool == "run_shell_command":
                return self.run_shell(str(arguments["command"]), timeout)
            if tool == "read_file":
                return self.read_file(str(arguments["path"]))
            if tool == "write_file":
                return self.write_file(str(arguments["path"]), str(arguments["content"]))
            if tool == "list_directory":
                return self.list_directory(str(arguments.get("path", ".")))
            if tool == "create_directory":
                return self.create_directory(str(arguments["path"]))
            return result(stderr=f"unknown tool {tool!r}\n", is_error=True)
        except ToolFailure as exc:
            return result(stderr=f"{tool}: {exc}\n", is_error=True)
        except OSError as exc:
            return result(stderr=f"{tool}: {exc.strerror or exc}\n", is_error=True)
        except ValueError as exc:
            return result(stderr=f"{tool}: {exc}\n", is_error=True)

    def run_cell(self, code: str, timeout: float) -> dict[str, Any]:
        capture = Capture(self.max_output)
        failed = False
        try:
            with capture:
                failed = not self.execute(code, timeout)
            return result(capture.read(0), capture.read(1), is_error=failed)
        finally:
            capture.close()

    def execute(self, code: str, timeout: float) -> bool:
        """Run a cell; print the value of a final expression. False when it raised."""
        os.chdir(WORKSPACE)
        # Each cell gets the CPU budget anew; the hard limit caps the interpreter's lifetime.
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = int(_cpu_used()) + self.cpu_seconds
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
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
        capture = Capture(self.max_output)
        try:
            process = subprocess.Popen(
                [*self.shell_prefix, "/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=capture.fds[0],
                stderr=capture.fds[1],
                cwd=WORKSPACE,
                start_new_session=True,
            )
            note = ""
            try:
                returncode = process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                returncode = process.wait()
                note = f"\n[the command ran past its time limit of {timeout:g} s and was killed]\n"
            stderr = capture.read(1) + note
            return result(capture.read(0), stderr, returncode, is_error=returncode != 0)
        finally:
            capture.close()

    def read_file(self, path: str) -> dict[str, Any]:
        full = workspace_path(path)
        with open(full, "rb") as file:
            data = file.read(self.max_output + 1)
        if len(data) > self.max_output:
            raise ToolFailure(f"{path!r} is larger than {self.max_output} bytes")
        try:
            return result(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise ToolFailure(f"{path!r} is not UTF-8 text") from None

    def write_file(self, path: str, content: str) -> dict[str, Any]:
        full = workspace_path(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as file:
            file.write(content)
        return result(f"Wrote {len(content)} characters to {path}")

    def list_directory(self, path: str) -> dict[str, Any]:
        full = workspace_path(path)
        lines = []
        with os.scandir(full) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                kind = "[DIR]" if entry.is_dir(follow_symlinks=False) else "[FILE]"
                lines.append(f"{kind} {entry.name}")
        return result("".join(line + "\n" for line in lines))

    def create_directory(self, path: str) -> dict[str, Any]:
        os.makedirs(workspace_path(path), exist_ok=True)
        return result(f"Created directory {path}")

    def stop_strays(self) -> None:
        """Kill every process of the sandbox but this one (and the namespace's init)."""
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


def main() -> None:
    Agent(json.loads(sys.argv[1])).serve()


if __name__ == "__main__":
    main()
