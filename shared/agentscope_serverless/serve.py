"""Serve an agent over HTTP: the composition root of a server process, without the CLI.

::

    python -m agentscope_serverless.serve --agent mypkg.agent:app --port 8080

An archive's entry command (AgentRun, ModelStudio) runs this, and ``agentscope-serverless
serve`` builds on it. Settings are read here, once (environment, then the ``SECRETS_ARN``
secret), and handed to the application. The agent's module is imported from ``--app-dir``
(default: the working directory), as uvicorn does, and from its ``src/`` folder in the src
layout.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from agentscope_serverless.auth.base import KeyStore
    from agentscope_serverless.settings import Settings

APP_DIR_ENV = "AGENTSCOPE_APP_DIR"
# How long a server told to stop (SIGTERM, Ctrl-C) waits for the requests still open to end:
# then they are cancelled, and the runs still going are canceled as the server stops (each
# agent's cleanup has CLEANUP_SECONDS more), so it exits within seconds even while a plain
# function blocks (a thread cannot be stopped: it is left, a daemon one).
STOP_GRACE_SECONDS = 5
#: The files whose change restarts a server of ``--reload`` (see ``reloader.WATCHED``).
WATCHED_FILES = "a .py, requirements*.txt, .env, .toml, .yaml, .ini or .cfg file"
#: The folders ``--reload`` never watches, besides any virtualenv (a folder with a
#: ``pyvenv.cfg``), as ``reloader`` applies them.
IGNORED_FOLDERS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        "node_modules",
        "dist",
        "build",
        ".aws-sam",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".idea",
    }
)
_IGNORED_NAMES = sorted(IGNORED_FOLDERS, key=lambda name: name.lstrip("._"))
#: :data:`IGNORED_FOLDERS` as the help of ``--reload`` says them.
IGNORED_FOLDERS_TEXT = f"virtualenvs, {', '.join(_IGNORED_NAMES[:-1])} or {_IGNORED_NAMES[-1]}"


#: uvicorn's log levels (``uvicorn.config.LOG_LEVELS``), most verbose last.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def listen_options_problem(port: int, log_level: str) -> str | None:
    """What is wrong with ``--port`` or ``--log-level`` (in any case), as the message to
    print; None when uvicorn takes both. Checked before the agent is loaded: uvicorn takes
    a port modulo 65536 (99999 listens on 34463) and fails on an unknown level only after.

    >>> listen_options_problem(99999, "info")
    '--port must be a port number from 0 to 65535, not 99999'
    >>> listen_options_problem(8090, "WARNING") is None
    True
    """
    if log_level.lower() not in LOG_LEVELS:
        return f"--log-level {log_level!r}: give one of {', '.join(LOG_LEVELS)}"
    if not 0 <= port <= 65535:
        return f"--port must be a port number from 0 to 65535, not {port}"
    return None


# What a project has at its root to be installed by pip.
PACKAGING_FILES = ("pyproject.toml", "setup.py", "setup.cfg")


def source_root(project: Path) -> Path | None:
    """The ``src/`` folder of a project in the src layout (a packaging file at its root, its
    packages under ``src/``, itself no package), whose packages pip installs as top-level
    ones; None for any other project."""
    src = project / "src"
    laid_out = any((project / name).is_file() for name in PACKAGING_FILES)
    return src if laid_out and src.is_dir() and not (src / "__init__.py").exists() else None


def use_app_dir(app_dir: str | Path | None) -> Path:
    """Put ``app_dir`` (default: the working directory) first on the import path, and its
    ``src/`` folder after it when it is a project in the src layout (:func:`source_root`)."""
    path = Path(app_dir or ".").resolve()
    src = source_root(path)
    for position, folder in enumerate([path] if src is None else [path, src]):
        if str(folder) not in sys.path:
            sys.path.insert(position, str(folder))
    return path


def root_settings(agent: str | None = None, **overrides: object) -> Settings:
    """The process's settings: the environment, ``agent`` and ``overrides`` if given, then the
    secret's fields."""
    from agentscope_serverless.aws_secrets import resolve_secrets
    from agentscope_serverless.settings import load_settings

    return resolve_secrets(load_settings(**({"agent_app": agent} if agent else {}), **overrides))


@dataclass
class Served:
    """An application ready to serve, with what the root built for it."""

    app: FastAPI
    settings: Settings
    key_store: KeyStore


def build(settings: Settings) -> Served:
    """The application of every router for ``settings`` (its key store included)."""
    from agentscope_serverless.auth.factory import create_key_store
    from agentscope_serverless.http.app import RuntimeApplication, create_app

    key_store = create_key_store(settings)
    app = create_app(settings=settings, key_store=key_store)
    if isinstance(app, RuntimeApplication):
        app.build_middleware()
    return Served(app, settings, key_store)


def development_key(key_store: KeyStore, user: str = "dev") -> str | None:
    """A new key of ``user`` when ``key_store`` is in memory (the embedded default, which no
    command can add keys to: without one, no caller would be accepted); None otherwise."""
    from agentscope_serverless.auth import InMemoryKeyStore

    if not isinstance(key_store, InMemoryKeyStore):
        return None

    async def issue() -> str:
        await key_store.start()
        return (await key_store.create_key(kind="user", user_id=user)).key

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(issue())
    # Called from code running an event loop (a notebook's, LocalDeployManager.deploy_sync
    # in a coroutine): issued on a loop of its own, in a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:
        return thread.submit(asyncio.run, issue()).result()


def _print_development_key(key: str) -> None:
    print(f"development key (user 'dev', valid while this server runs): {key}", flush=True)


def announce_development_key(key_store: KeyStore) -> str | None:
    """Print a development key of ``key_store`` when it is in memory (see
    :func:`development_key`): what a script serving an app (``app.run()``, a local
    deployment) is called with. The key, or None."""
    key = development_key(key_store)
    if key is not None:
        _print_development_key(key)
    return key


async def issue_development_key(key_store: KeyStore) -> str | None:
    """:func:`announce_development_key` for a started ``key_store``, from its server's loop
    (an application of ``AgentApp.get_fastapi_app()`` as it starts)."""
    from agentscope_serverless.auth import InMemoryKeyStore

    if not isinstance(key_store, InMemoryKeyStore):
        return None
    key = (await key_store.create_key(kind="user", user_id="dev")).key
    _print_development_key(key)
    if multiprocessing.parent_process() is not None:
        # A worker of uvicorn's --workers or --reload: each has its own in-memory keys.
        print(
            "  (this worker process's key: another worker, or the next one after a reload, "
            "refuses it; AUTH_KEYS_BACKEND=file shares keys between workers)",
            flush=True,
        )
    return key


def create() -> ASGIApp:
    """The application for uvicorn's ``--factory`` (and ``--reload``): the root in a worker.

    The agent comes from ``AGENT_APP`` and the import path from ``AGENTSCOPE_APP_DIR``. On
    the in-memory key store (the default), a development key is printed once the start
    succeeded, as ``agentscope-serverless serve`` does: without one no caller would be
    accepted. An agent that cannot be served (its module failing, or its start: a hook, a
    store) is one line, not a traceback, and until a file changes (the fix: the reloader
    starts another worker) every request is answered 503 saying so, rather than left waiting
    on a port no worker serves.
    """
    from agentscope_serverless.errors import AgentScopeServerlessError
    from agentscope_serverless.http.app import RuntimeApplication

    use_app_dir(os.environ.get(APP_DIR_ENV))
    try:
        app = build(root_settings()).app
        if isinstance(app, RuntimeApplication):
            app.announces_development_key = True  # on an in-memory key store only
        return _StartedOrUnavailable(app)
    except AgentScopeServerlessError as exc:
        _print_not_loaded(exc.message)
        return _not_loaded()


def _print_not_loaded(reason: str) -> None:
    print(
        f"error: {reason} (the server starts again when {WATCHED_FILES} of the project changes)",
        file=sys.stderr,
        flush=True,
    )


class _StartedOrUnavailable:
    """``app`` once its start (lifespan) completes; if it fails, one line says why and every
    request is answered 503 (:func:`_not_loaded`) rather than the worker exiting, leaving
    the port to a reloader that serves no request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.unavailable: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
        else:
            await (self.unavailable or self.app)(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        to_app: asyncio.Queue[Message] = asyncio.Queue()
        from_app: asyncio.Queue[Message] = asyncio.Queue()
        await to_app.put(await receive())  # lifespan.startup
        running = asyncio.ensure_future(self.app(scope, to_app.get, from_app.put))
        replied = asyncio.ensure_future(from_app.get())
        await asyncio.wait({running, replied}, return_when=asyncio.FIRST_COMPLETED)
        if replied.done() and replied.result()["type"] == "lifespan.startup.complete":
            await send(replied.result())
            await to_app.put(await receive())  # lifespan.shutdown
            await running
            while not from_app.empty():
                await send(from_app.get_nowait())
            return
        replied.cancel()
        # Starlette says the start failed, then raises what failed it.
        await asyncio.wait({running}, timeout=1)
        failure = None if running.cancelled() or not running.done() else running.exception()
        running.cancel()
        _print_not_loaded(_start_failure(failure))
        self.unavailable = _not_loaded()
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})


def _start_failure(exc: BaseException | None) -> str:
    """What failed the start of the application, in one line, its secrets masked (as
    :func:`~agentscope_serverless.log.redacted` masks them)."""
    from agentscope_serverless.errors import AgentScopeServerlessError
    from agentscope_serverless.log import redacted

    if isinstance(exc, AgentScopeServerlessError):
        return f"the agent could not start: {redacted(exc.message)}"
    if exc is None:
        return "the agent could not start (the server's output says why)"
    return f"the agent could not start: {redacted(f'{type(exc).__name__}: {exc}')}"


def _not_loaded() -> ASGIApp:
    """An application answering every request 503, whatever its method (a browser's
    preflight ``OPTIONS`` too), with its ``X-Request-Id`` and its log line: the agent could
    not be loaded (why is said on the server's output only: it may quote the agent's own
    error)."""
    from agentscope_serverless.http.errors import error_response
    from agentscope_serverless.http.middleware import RequestContextMiddleware

    message = (
        "the agent could not be loaded or started (the server's output says why); the server "
        f"starts again when {WATCHED_FILES} of the project changes"
    )

    async def unavailable(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await error_response(503, "UNAVAILABLE", message)(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013})  # try again later

    return RequestContextMiddleware(unavailable)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m agentscope_serverless.serve``: parse the options and serve until stopped."""
    parser = argparse.ArgumentParser(prog="python -m agentscope_serverless.serve")
    parser.add_argument("--agent", help="The AgentApp to serve, as module:attribute.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--app-dir", default=".", help="Where the agent's modules are.")
    parser.add_argument("--log-level", default="info")
    options = parser.parse_args(argv)
    problem = listen_options_problem(options.port, options.log_level)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)

    from agentscope_serverless import stopping_server
    from agentscope_serverless.errors import AgentScopeServerlessError
    from agentscope_serverless.head_timeout import head_timeout_protocol
    from agentscope_serverless.settings import agent_app_problem

    problem = agent_app_problem(options.agent) if options.agent else None
    if problem is not None:
        print(f"error: --agent {options.agent!r}: {problem}", file=sys.stderr)
        raise SystemExit(2)
    use_app_dir(options.app_dir)
    try:
        served = build(root_settings(options.agent))
    except AgentScopeServerlessError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None
    settings = served.settings
    print(f"serving {settings.agent_app} on {options.host}:{options.port}", flush=True)
    keys = settings.auth_keys_backend
    where = {"file": f" {settings.auth_keys_file}", "dynamodb": f" {settings.auth_keys_table}"}
    print(f"API keys: {keys}{where.get(keys, ' (empty: no caller is accepted)')}", flush=True)
    stopping_server.run(
        served.app,
        host=options.host,
        port=options.port,
        http=head_timeout_protocol(
            settings.request_head_timeout_seconds, settings.request_body_timeout_seconds
        ),
        log_level=options.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=STOP_GRACE_SECONDS,
    )


if __name__ == "__main__":
    main()


__all__ = [
    "APP_DIR_ENV",
    "IGNORED_FOLDERS",
    "IGNORED_FOLDERS_TEXT",
    "WATCHED_FILES",
    "Served",
    "announce_development_key",
    "build",
    "create",
    "development_key",
    "issue_development_key",
    "main",
    "root_settings",
    "source_root",
    "use_app_dir",
]
