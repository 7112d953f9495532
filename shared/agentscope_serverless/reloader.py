"""``agentscope-serverless serve --reload``: a worker process serves the project, and another
one replaces it when a file of the project changes.

uvicorn's reloader, with what an agent's project needs:

- what is watched: the project's sources and configuration (:data:`WATCHED`), through the
  system's file events (watchfiles), never in virtualenvs, ``.git``, caches or build
  outputs (:data:`IGNORED_FOLDERS`): an idle server costs nothing;
- while the agent's module imports, requests are answered 503 and a stop signal stops the
  worker at once (:class:`LoadingWorker`), so a fix replaces a module stuck at import;
- a worker replaced on a change that does not stop within :data:`STOP_GRACE_SECONDS` (a
  start or stop hook that never returns) is killed;
- stopped (SIGTERM, Ctrl-C), the reloader lets its worker stop as a server without
  ``--reload`` does (its grace for the requests still open, then their runs canceled, each
  client getting its run's ``canceled`` end), killing it only past that stop's longest time
  (:meth:`ProjectReload.stop_seconds`); a second signal kills it at once.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import select
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from socket import socket
from types import FrameType

from uvicorn._subprocess import get_subprocess
from uvicorn.config import Config
from uvicorn.server import Server
from uvicorn.supervisors.basereload import BaseReload
from watchfiles import Change, watch

from agentscope_serverless.serve import IGNORED_FOLDERS, WATCHED_FILES

logger = logging.getLogger("uvicorn.error")

#: The names of the files whose change restarts the server: sources, requirements, and the
#: configuration a project reads (dotenv's ``.env`` files, TOML, YAML, INI), as
#: :data:`~agentscope_serverless.serve.WATCHED_FILES` says.
WATCHED = (
    "*.py",
    "requirements*.txt",
    "*.toml",
    "*.yaml",
    "*.yml",
    "*.ini",
    "*.cfg",
    ".env",
    ".env.*",
    "*.env",
)
#: Editors' temporary and backup files, never a change of the project.
EDITOR_FILES = ("*.sw?", "*~", ".#*", "*.tmp", "*.bak")
#: Seconds a worker replaced on a change has to stop before it is killed.
STOP_GRACE_SECONDS = 3.0
#: Seconds left to a worker stopped with the reloader beyond the longest its stop takes.
STOP_MARGIN_SECONDS = 5.0


class ProjectFiles:
    """Whether a changed path is one of the project's :data:`WATCHED` files, outside the
    :data:`IGNORED_FOLDERS` and virtualenvs of ``root``.

    >>> ProjectFiles(Path("/p"))(Change.modified, "/p/.venv/lib/x.py")   # doctest: +SKIP
    False
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, change: Change, path: str) -> bool:
        changed = Path(path)
        try:
            folders = changed.relative_to(self.root).parts[:-1]
        except ValueError:
            return False
        if IGNORED_FOLDERS.intersection(folders):
            return False
        name = changed.name
        if any(fnmatch.fnmatch(name, pattern) for pattern in EDITOR_FILES):
            return False
        if not any(fnmatch.fnmatch(name, pattern) for pattern in WATCHED):
            return False
        folder = self.root
        for part in folders:
            folder = folder / part
            if (folder / "pyvenv.cfg").is_file():
                return False
        return True


class ProjectReload(BaseReload):
    """uvicorn's reloader watching the project's files (:class:`ProjectFiles`) of ``root``,
    which kills a worker that does not stop in time."""

    def __init__(
        self,
        config: Config,
        target: Callable[[list[socket] | None], None],
        sockets: list[socket],
        *,
        root: Path,
    ) -> None:
        super().__init__(config, target, sockets)
        self.reloader_name = "WatchFiles"
        #: The signal that stopped the reloader, if one did.
        self.stopped_by: int | None = None
        self.watcher = watch(
            root,
            watch_filter=ProjectFiles(root),
            stop_event=self.should_exit,
            yield_on_timeout=True,
            ignore_permission_denied=True,
        )

    def signal_handler(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit.is_set():
            # Asked twice (Ctrl-C again): the worker is killed now, not after the grace.
            process = getattr(self, "process", None)
            if process is not None and process.is_alive():
                process.kill()
            return
        self.stopped_by = sig
        self.should_exit.set()

    def should_restart(self) -> list[Path] | None:
        self.pause()
        changes = next(self.watcher)
        return sorted({Path(path) for _, path in changes}) or None

    def restart(self) -> None:
        # A change: its fix is what is waited for, not the requests of the code it replaces.
        self._stop_worker(STOP_GRACE_SECONDS)
        self.process = get_subprocess(config=self.config, target=self.target, sockets=self.sockets)
        self.process.start()

    def shutdown(self) -> None:
        self._stop_worker(self.stop_seconds())
        for sock in self.sockets:
            sock.close()
        logger.info("Stopping reloader process [%s]", self.pid)

    def stop_seconds(self) -> float:
        """The longest a worker's stop takes, and :data:`STOP_MARGIN_SECONDS`: its wait for
        the requests still open (``timeout_graceful_shutdown``: their grace, then their runs'
        cancellation), then its app's stop (the background tasks', the stop hooks')."""
        from agentscope_serverless.runner import SHUTDOWN_HANDLER_SECONDS
        from agentscope_serverless.tasks import STOP_WAIT_SECONDS

        requests = self.config.timeout_graceful_shutdown
        if requests is None:  # it waits for the requests, however long
            return float("inf")
        return requests + 2 * STOP_WAIT_SECONDS + SHUTDOWN_HANDLER_SECONDS + STOP_MARGIN_SECONDS

    def _stop_worker(self, seconds: float) -> None:
        self.process.terminate()
        self.process.join(None if seconds == float("inf") else seconds)
        if self.process.is_alive():
            logger.warning("the server's process did not stop within %s s: killed", f"{seconds:g}")
            self.process.kill()
            self.process.join()


class LoadingWorker:
    """A worker of :class:`ProjectReload`: while the agent's module imports, each request is
    answered 503 (the agent is still loading) rather than left waiting, and a stop signal
    stops it at once; then ``server`` serves.

    uvicorn imports the application after it takes the stop signals over, holding them off
    until the import returns, and accepts no connection until then: a module stuck at import
    (a call that never returns) left clients hanging and the worker deaf to its reloader.
    """

    def __init__(self, server: Server) -> None:
        self.server = server

    def run(self, sockets: list[socket] | None = None) -> None:
        answers = None
        if sockets:
            # Listening already (uvicorn listens once the application is loaded).
            sockets[0].listen(self.server.config.backlog)
            answers = LoadingAnswers(sockets[0])
            answers.start()
        try:
            self.server.config.load()
        except KeyboardInterrupt:  # Ctrl-C as the module imports: the reloader stops too
            return
        finally:
            if answers is not None:
                answers.stop()
        self.server.run(sockets=sockets)


class LoadingAnswers(threading.Thread):
    """Answer each connection to ``listener`` with a 503 saying the agent is still loading,
    until :meth:`stop`."""

    def __init__(self, listener: socket) -> None:
        super().__init__(name="loading-answers", daemon=True)
        self.listener = listener
        self.since = time.monotonic()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            ready, _, _ = select.select([self.listener], [], [], 0.1)
            if not ready or self.stopping.is_set():
                continue
            try:
                connection, _ = self.listener.accept()
            except OSError:
                continue
            with connection, contextlib.suppress(OSError):
                connection.settimeout(1)
                connection.recv(65536)  # the request's head, left unanswered
                connection.sendall(self.answer())

    def answer(self) -> bytes:
        seconds = time.monotonic() - self.since
        message = (
            f"the agent is still loading (its module has been importing for {seconds:.0f} s); "
            f"the server answers once it is loaded, or starts again when {WATCHED_FILES} of "
            "the project changes"
        )
        body = json.dumps(
            {
                "error": {
                    "code": "UNAVAILABLE",
                    "message": message,
                    "type": "server_error",
                    "param": None,
                }
            }
        ).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
        )
        return head.encode() + body

    def stop(self) -> None:
        self.stopping.set()
        self.join()


def stop_signal_exit(sig: int | None) -> None:
    """Leave as the server without ``--reload`` does once ``sig`` stopped it: Ctrl-C as an
    interruption, SIGTERM with status 143.

    The worker is gone by then: a Ctrl-C pressed again as the process exits is ignored (the
    interpreter puts the default action back as it finalizes, and such a press killed the
    process before its exit status was set)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sig == signal.SIGINT:
        raise KeyboardInterrupt
    if sig is not None:
        raise SystemExit(128 + sig)


__all__ = [
    "IGNORED_FOLDERS",
    "STOP_GRACE_SECONDS",
    "WATCHED",
    "LoadingAnswers",
    "LoadingWorker",
    "ProjectFiles",
    "ProjectReload",
    "stop_signal_exit",
]
