"""``agentscope-sandbox-server``: run the sandbox server.

The bearer token comes from ``SANDBOX_SERVER_TOKEN`` or ``--token-file`` (never from the
command line, where other users could read it). Without one the server refuses to start,
unless ``--dev`` asks it to make a random token and print it::

    SANDBOX_SERVER_TOKEN=$(openssl rand -hex 32) agentscope-sandbox-server --port 8000
    agentscope-sandbox-server --dev --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.head_timeout import (
    DEFAULT_BODY_TIMEOUT_SECONDS,
    DEFAULT_HEAD_TIMEOUT_SECONDS,
    head_timeout_protocol,
)
from agentscope_serverless.sandbox_protocol import MIN_BEARER_TOKEN_LENGTH
from agentscope_serverless.sandbox_server.app import create_app
from agentscope_serverless.sandbox_server.bodylimit import BODY_WAIT_SECONDS, DEFAULT_BODIES_BYTES
from agentscope_serverless.sandbox_server.isolation import FIRST_HOST_UID, Limits, Toolchain
from agentscope_serverless.sandbox_server.jail import (
    HostIsolation,
    how_to_enforce,
    remove_tree,
    spare_from_oom_killer,
)
from agentscope_serverless.sandbox_server.manager import SandboxManager, ServerConfig

TOKEN_ENV = "SANDBOX_SERVER_TOKEN"  # noqa: S105 - a variable name, not a secret
DEFAULT_ROOT = "/var/lib/agentscope-sandbox"
# As root each sandbox runs as a host uid of its own (--first-sandbox-uid); otherwise as ours.
SHARED_UID_WARNING = (
    "not run as root, every sandbox runs as this server's uid: per-uid kernel quotas "
    "(inotify instances and watches, among others) are shared between sandboxes and with "
    "the server: one sandbox that exhausts one (such as fs.inotify.max_user_instances) makes "
    "it fail for the other sandboxes and every process of this uid until it is released"
)


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < math.inf:  # inf would be no limit: half-sent requests held forever
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds above 0")
    return seconds


def _overcommit(text: str) -> float:
    try:
        times = float(text)
    except ValueError:
        times = 0.0
    if not 0 < times < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number above 0")
    return times


def _cpus(text: str) -> float:
    """CPUs of a sandbox: a negative quota is no limit to cgroup v1, nan none at all."""
    try:
        cpus = float(text)
    except ValueError:
        cpus = -1.0
    if not 0 <= cpus < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of CPUs, 0 or more")
    return cpus


def _whole(minimum: int) -> Callable[[str], int]:
    """A parser of whole numbers from ``minimum`` on (a limit below it means nothing)."""

    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number, {minimum} or more")
        return number

    return parse


def _parser() -> argparse.ArgumentParser:
    defaults = Limits()
    parser = argparse.ArgumentParser(
        prog="agentscope-sandbox-server",
        description="Run sandboxes (Python, shell, files) behind AgentScope's sandbox protocol.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    parser.add_argument("--uds", help="listen on this Unix socket instead of TCP")
    parser.add_argument(
        "--root",
        default=os.environ.get("SANDBOX_SERVER_ROOT", DEFAULT_ROOT),
        help="directory holding the sandboxes' workspaces (env SANDBOX_SERVER_ROOT)",
    )
    parser.add_argument("--token-file", help=f"file holding the bearer token (else ${TOKEN_ENV})")
    parser.add_argument("--token-fd", type=int, help="read the bearer token from this descriptor")
    parser.add_argument(
        "--dev", action="store_true", help="without a token, make a random one and print it"
    )
    parser.add_argument("--cpu-seconds", type=_whole(1), default=defaults.cpu_seconds)
    parser.add_argument(
        "--memory-mb",
        type=_whole(0),
        default=defaults.total_memory_bytes // 1024**2,
        help="memory of a sandbox: of each process, and of all of them with their tmpfs "
        "together (0: no total)",
    )
    parser.add_argument(
        "--memory-overcommit",
        type=_overcommit,
        default=os.environ.get("SANDBOX_SERVER_MEMORY_OVERCOMMIT", "1.0"),
        help="how many times the host's memory (less 1 GiB for the server) the sandboxes' "
        "--memory-mb may add up to; past it a new sandbox is refused (429); above 1, "
        "sandboxes all using theirs would run the host out of memory "
        "(env SANDBOX_SERVER_MEMORY_OVERCOMMIT)",
    )
    parser.add_argument(
        "--workspace-mb",
        type=_whole(0),
        default=defaults.workspace_bytes // 1024**2,
        help="disk of a sandbox's workspace (0: no cap)",
    )
    parser.add_argument(
        "--cpus", type=_cpus, default=defaults.cpus, help="CPUs a sandbox may use (0: no cap)"
    )
    parser.add_argument(
        "--max-tasks",
        type=_whole(0),
        default=defaults.total_processes,
        help="processes and threads of a sandbox together (0: no cap)",
    )
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="let a sandbox's processes run between calls (they are frozen by default)",
    )
    parser.add_argument(
        "--weaker-isolation",
        action="store_true",
        help="run even when this host cannot enforce the totals above",
    )
    parser.add_argument(
        "--file-size-mb", type=_whole(0), default=defaults.file_size_bytes // 1024**2
    )
    parser.add_argument(
        "--interpreter-cpu-seconds",
        type=_whole(1),
        default=defaults.interpreter_cpu_seconds,
        help="CPU time a Python interpreter may use over its whole life",
    )
    parser.add_argument("--max-processes", type=_whole(1), default=defaults.processes)
    parser.add_argument(
        "--call-timeout",
        type=_positive_seconds,
        default=defaults.call_timeout_seconds,
        help="seconds",
    )
    parser.add_argument("--idle-timeout", type=_positive_seconds, default=1800.0, help="seconds")
    parser.add_argument(
        "--header-timeout",
        type=_positive_seconds,
        default=DEFAULT_HEAD_TIMEOUT_SECONDS,
        help="seconds a client has to send a request's line and headers before its "
        "connection is closed",
    )
    parser.add_argument(
        "--body-timeout",
        type=_positive_seconds,
        default=DEFAULT_BODY_TIMEOUT_SECONDS,
        help="seconds a request's body may stop arriving before its connection is closed",
    )
    parser.add_argument("--max-sandboxes", type=_whole(1), default=64)
    parser.add_argument(
        "--max-sandboxes-per-owner",
        type=_whole(1),
        help="sandboxes one owner (meta.owner_id, e.g. a user) may hold (default: all)",
    )
    parser.add_argument("--max-output-bytes", type=_whole(1), default=1024**2)
    parser.add_argument(
        "--request-bodies-mb",
        type=_whole(1),
        default=os.environ.get(
            "SANDBOX_SERVER_REQUEST_BODIES_MB", str(DEFAULT_BODIES_BYTES // 1024**2)
        ),
        help="request bodies the server holds at once, together; a request past it waits "
        f"for room ({BODY_WAIT_SECONDS:g} s at most, else 503) "
        "(env SANDBOX_SERVER_REQUEST_BODIES_MB)",
    )
    parser.add_argument(
        "--first-sandbox-uid",
        type=int,
        default=FIRST_HOST_UID,
        help="host uid (and gid) of the first sandbox, as root: each sandbox runs as one of "
        "its own, the --max-sandboxes uids from this one on, which no host user, group or "
        "subordinate range may hold",
    )
    parser.add_argument("--python", default="/usr/bin/python3", help="Python used in sandboxes")
    parser.add_argument(
        "--parent-pid", type=int, help="exit when this process is gone (embedded use)"
    )
    parser.add_argument(
        "--parents-directory",
        type=Path,
        help="the directory the parent made for this server (holding --root): deleted when "
        "the server exits for its parent is gone, as the parent would have (embedded use)",
    )
    parser.add_argument("--log-level", default="info")
    return parser


def _token(args: argparse.Namespace) -> str:
    if args.token_fd is not None:
        with os.fdopen(args.token_fd, "rb") as source:
            token = source.read(4096).decode().strip()
    elif args.token_file:
        token = Path(args.token_file).read_text().strip()
    else:
        token = os.environ.pop(TOKEN_ENV, "").strip()
    if not token and args.dev:
        token = secrets.token_urlsafe(32)
        print(f"sandbox server bearer token (dev mode): {token}", flush=True)
    if not token:
        raise ConfigurationError(
            f"no bearer token: set {TOKEN_ENV} or --token-file (or pass --dev for a random one)"
        )
    if len(token) < MIN_BEARER_TOKEN_LENGTH:
        raise ConfigurationError(
            f"the bearer token must have at least {MIN_BEARER_TOKEN_LENGTH} characters"
        )
    return token


class _Server(uvicorn.Server):
    """uvicorn's server, releasing the sandboxes as soon as it begins to shut down: calls in
    flight end at once and answer 503 saying so, rather than being cut off (a bare 500)
    once the graceful shutdown's time is out."""

    def __init__(self, config: uvicorn.Config, manager: SandboxManager) -> None:
        super().__init__(config)
        self._manager = manager

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._manager.stop_serving()
        await super().shutdown(sockets)


async def _watch_parent(server: uvicorn.Server, parent_pid: int) -> None:
    # Nothing signals a parent's death to a process that is not its child: poll for it.
    while os.getppid() == parent_pid:  # noqa: ASYNC110
        await asyncio.sleep(1.0)
    server.should_exit = True


async def _serve(
    server: uvicorn.Server, parent_pid: int | None, parents_directory: Path | None = None
) -> None:
    watcher = asyncio.create_task(_watch_parent(server, parent_pid)) if parent_pid else None
    try:
        await server.serve()
    finally:
        orphaned = watcher is not None and watcher.done() and not watcher.cancelled()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
    if orphaned and parents_directory is not None:
        # The parent (killed, it never stopped this server) cannot delete it any more.
        remove_tree(parents_directory)


def _host_isolation(config: ServerConfig) -> HostIsolation:
    """What this host enforces; exit when a configured bound cannot be (unless weaker)."""
    config.root.mkdir(parents=True, exist_ok=True)
    host = HostIsolation.probe(config.root)
    configured = config.configured_bounds()
    missing = host.missing(configured)
    enforced = [bound for bound in configured if bound not in missing]
    print(
        "agentscope-sandbox-server: enforcing sandbox bounds: "
        f"{', '.join(enforced) or 'none'}"
        + (f"; NOT enforced: {', '.join(missing)}" if missing else ""),
        file=sys.stderr,
        flush=True,
    )
    if os.geteuid() != 0:
        print(f"agentscope-sandbox-server: {SHARED_UID_WARNING}", file=sys.stderr, flush=True)
    if missing and not config.weaker_isolation:
        host.close()
        print(
            f"agentscope-sandbox-server: this host cannot enforce {', '.join(missing)} "
            f"({how_to_enforce(missing)}, or pass --weaker-isolation)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return host


def _without_token_in_environment(argv: list[str], *, pass_token: bool) -> None:
    """Start again with the token gone from the environment (on a pipe when ``pass_token``):
    the kernel keeps a process's initial environment readable in ``/proc/<pid>/environ``."""
    token = os.environ.pop(TOKEN_ENV).encode()
    command = [sys.executable, "-m", "agentscope_serverless.sandbox_server", *argv]
    if pass_token:
        reader, writer = os.pipe()
        os.write(writer, token)  # far less than a pipe's buffer
        os.close(writer)
        os.set_inheritable(reader, True)
        command += ["--token-fd", str(reader)]
    os.execve(sys.executable, command, dict(os.environ))  # noqa: S606 - this same program


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and serve until interrupted."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if TOKEN_ENV in os.environ:
        _without_token_in_environment(
            argv, pass_token=args.token_fd is None and not args.token_file
        )
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        token = _token(args)
        toolchain = Toolchain.find(args.python)
        limits = Limits(
            cpu_seconds=args.cpu_seconds,
            memory_bytes=(args.memory_mb or 1024) * 1024**2,
            total_memory_bytes=args.memory_mb * 1024**2,
            workspace_bytes=args.workspace_mb * 1024**2,
            total_processes=args.max_tasks,
            cpus=args.cpus,
            file_size_bytes=args.file_size_mb * 1024**2,
            processes=args.max_processes,
            interpreter_cpu_seconds=args.interpreter_cpu_seconds,
            call_timeout_seconds=args.call_timeout,
        )
    except (ConfigurationError, OSError) as exc:
        print(f"agentscope-sandbox-server: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    config = ServerConfig(
        root=Path(args.root),
        limits=limits,
        idle_timeout_seconds=args.idle_timeout,
        max_sandboxes=args.max_sandboxes,
        max_sandboxes_per_owner=args.max_sandboxes_per_owner or args.max_sandboxes,
        max_output_bytes=args.max_output_bytes,
        weaker_isolation=args.weaker_isolation,
        freeze_between_calls=not args.no_freeze,
        first_sandbox_uid=args.first_sandbox_uid,
        memory_overcommit=args.memory_overcommit,
    )
    spare_from_oom_killer()
    manager = SandboxManager(config, toolchain, _host_isolation(config))
    app = create_app(manager, token, bodies_bytes=args.request_bodies_mb * 1024**2)
    server = _Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            uds=args.uds,
            http=head_timeout_protocol(args.header_timeout, args.body_timeout),
            log_level=args.log_level,
            access_log=False,
            # Release is bounded: shutdown does not wait long for calls in flight.
            timeout_graceful_shutdown=5,
        ),
        manager,
    )
    # uvicorn shuts down gracefully on SIGINT and SIGTERM, then re-raises the signal: an
    # interrupt is the expected way out, not an error to print a traceback for.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(server, args.parent_pid, args.parents_directory))


__all__ = ["main"]
