"""The embedded local sandbox: our sandbox server as a child process on a private Unix socket.

``SandboxService()`` without a base URL starts one, so local runs behave exactly like
remote ones: the same program, protocol, isolation and client code, only without TCP. The
server gets a fresh random token, listens on a socket in a private directory, and exits on
its own if this process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from agentscope_serverless.errors import SandboxUnavailableError

START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0
SERVER_MODULE = "agentscope_serverless.sandbox_server"
# All of this process's environment the server gets: never its secrets (API keys, AWS
# credentials, database URLs); only where to find programs and the package.
PASSED_ENVIRONMENT = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TZ")


class EmbeddedSandboxServer:
    """Starts and stops a private sandbox server for this process.

    >>> async def demo() -> None:
    ...     server = EmbeddedSandboxServer()
    ...     await server.start()
    ...     print(server.socket_path)
    ...     await server.stop()
    """

    def __init__(self, *, weaker_isolation: bool = False) -> None:
        self.token = secrets.token_urlsafe(32)
        self._weaker_isolation = weaker_isolation
        self._directory: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> str:
        """The Unix socket the server listens on."""
        if self._directory is None:
            raise RuntimeError("the embedded sandbox server is not started")
        return str(self._directory / "server.sock")

    async def start(self) -> None:
        """Start the server and wait until it answers ``/health``."""
        self._process = await asyncio.to_thread(self._spawn)
        try:
            await self._wait_until_ready()
        except BaseException:
            await self.stop()
            raise

    def _spawn(self) -> subprocess.Popen[bytes]:
        directory = Path(tempfile.mkdtemp(prefix="agentscope-sandbox-"))
        # Sandbox processes run as an unprivileged uid that must reach their workspaces below.
        directory.chmod(0o711)
        self._directory = directory
        reader, writer = os.pipe()
        os.write(writer, self.token.encode())  # far less than a pipe's buffer
        os.close(writer)
        with open(directory / "server.log", "wb") as log:
            try:
                return self._popen(directory, reader, log)
            finally:
                os.close(reader)

    def _popen(self, directory: Path, token_fd: int, log: Any) -> subprocess.Popen[bytes]:
        # The token travels on a pipe: an environment stays readable in /proc/<pid>/environ.
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                SERVER_MODULE,
                "--uds",
                self.socket_path,
                "--root",
                str(directory / "root"),
                "--parent-pid",
                str(os.getpid()),
                "--parents-directory",
                str(directory),
                "--token-fd",
                str(token_fd),
                "--log-level",
                "warning",
                *(["--weaker-isolation"] if self._weaker_isolation else []),
            ],
            env=self.environment(),
            pass_fds=(token_fd,),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )

    @staticmethod
    def environment() -> dict[str, str]:
        """The server's whole environment: a few harmless variables (its token is piped)."""
        return {name: os.environ[name] for name in PASSED_ENVIRONMENT if name in os.environ}

    async def stop(self) -> None:
        """Stop the server (it releases its sandboxes) and delete its directory."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        directory, self._directory = self._directory, None
        if directory is not None:
            # Imported here: a Lambda function, which never starts a server, lacks the module.
            from agentscope_serverless.sandbox_server.jail import remove_leftovers, remove_tree

            # What the server leaves when killed before its own clean-up (mounts, cgroups).
            await asyncio.to_thread(remove_leftovers, directory / "root")
            await asyncio.to_thread(remove_tree, directory)

    async def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        transport = httpx.AsyncHTTPTransport(uds=self.socket_path)
        async with httpx.AsyncClient(transport=transport, timeout=2.0) as client:
            while time.monotonic() < deadline:
                assert self._process is not None
                if self._process.poll() is not None:
                    tail = self._log_tail()
                    if "--weaker-isolation" in tail:
                        tail += (
                            " (for the embedded server: set SANDBOX_WEAKER_ISOLATION=true to "
                            "run it without those totals)"
                        )
                    raise SandboxUnavailableError(f"the embedded sandbox server exited: {tail}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("http://sandbox/health")).is_success:
                        return
                await asyncio.sleep(0.05)
        raise SandboxUnavailableError("the embedded sandbox server did not start in time")

    def _log_tail(self) -> str:
        assert self._directory is not None
        try:
            text = (self._directory / "server.log").read_text(errors="replace")
        except OSError:
            return "no output"
        return text.strip()[-2000:] or "no output"


__all__ = ["EmbeddedSandboxServer"]
