"""``LocalDeployManager``: serve an agent (or a plain function) on this machine, in the background.

>>> manager = LocalDeployManager(host="127.0.0.1", port=0)   # port 0: any free port
>>> # info = await manager.deploy(app)       -> {"deploy_id": "...", "url": "http://127.0.0.1:PORT"}
>>> # await manager.stop()

The server is uvicorn, running in a thread with its own event loop, so it keeps serving
while the caller's loop (or a synchronous caller) does other things.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import uvicorn
from pydantic import BaseModel

from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.deployers.base import DeployManager
from agentscope_serverless.schemas.agent_schemas import AgentRequest
from agentscope_serverless.settings import Settings


class ServerThread:
    """An ASGI application served by uvicorn in a background thread.

    >>> server = ServerThread(app, host="127.0.0.1", port=0)
    >>> # url = server.start(); ...; server.stop()
    """

    def __init__(
        self, app: Any, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        self.host = host
        config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, lifespan="on", access_log=False
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        """The base URL, once started."""
        if self.port is None:
            raise RuntimeError("the server is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server thread is serving."""
        return self._thread is not None and self._thread.is_alive() and self._server.started

    def start(self, timeout: float = 30.0) -> str:
        """Start serving and return the base URL (raises if it does not come up)."""
        self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start on {self.host}")
            time.sleep(0.01)
        sockets = [s for server in self._server.servers for s in server.sockets]
        self.port = int(sockets[0].getsockname()[1])
        return self.url

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving (waits for in-flight requests and the application's shutdown)."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


class LocalDeployManager(DeployManager):
    """Deploys an :class:`AgentApp` or a plain function on ``host:port`` (loopback).

    An AgentApp gets every router (``/process``, the OpenAI-compatible endpoints, sessions,
    memory, state, ``/health``), configured on the AgentApp itself; a plain function is
    served at ``endpoint_path`` (see :mod:`agentscope_serverless.http.function_app`).
    ``settings`` and ``key_store`` default to those from the environment.
    """

    def __init__(self, host: str = "localhost", port: int = 8090) -> None:
        super().__init__()
        self.host = host
        self.port = port
        self._server: ServerThread | None = None

    async def deploy(
        self,
        func: AgentApp | Callable[[Any], Any],
        endpoint_path: str = "/process",
        request_model: type[BaseModel] | None = AgentRequest,
        response_type: str = "sse",
        before_start: Callable[..., Any] | None = None,
        after_finish: Callable[..., Any] | None = None,
        *,
        settings: Settings | None = None,
        key_store: KeyStore | None = None,
        **kwargs: Any,
    ) -> dict[str, str]:
        """Serve ``func`` in the background; return ``{"deploy_id", "url"}``.

        ``kwargs`` are passed to the ``before_start``/``after_finish`` callbacks.
        """
        return await asyncio.to_thread(
            self.deploy_sync,
            func,
            endpoint_path,
            request_model,
            response_type,
            before_start,
            after_finish,
            settings=settings,
            key_store=key_store,
            **kwargs,
        )

    def deploy_sync(
        self,
        func: AgentApp | Callable[[Any], Any],
        endpoint_path: str = "/process",
        request_model: type[BaseModel] | None = AgentRequest,
        response_type: str = "sse",
        before_start: Callable[..., Any] | None = None,
        after_finish: Callable[..., Any] | None = None,
        *,
        settings: Settings | None = None,
        key_store: KeyStore | None = None,
        **kwargs: Any,
    ) -> dict[str, str]:
        """The blocking twin of :meth:`deploy`."""
        if self.is_running:
            raise RuntimeError(f"already serving at {self.service_url}; stop() it first")
        if settings is None:
            # A local deployment is its process's composition root.
            from agentscope_serverless.settings import get_settings

            settings = get_settings()
        if isinstance(func, AgentApp):
            customised = (
                endpoint_path != "/process",
                request_model is not AgentRequest,
                response_type != "sse",
                before_start is not None,
                after_finish is not None,
                bool(kwargs),
            )
            if any(customised):
                raise TypeError(
                    "an AgentApp carries its own endpoint_path, request_model and hooks: "
                    "set them on the AgentApp"
                )
            from agentscope_serverless.http import create_app

            app = create_app(settings=settings, agent_app=func, key_store=key_store)
        else:
            from agentscope_serverless.http.function_app import create_function_app

            app = create_function_app(
                func,
                endpoint_path=endpoint_path,
                request_model=request_model,
                response_type=response_type,
                before_start=before_start,
                after_finish=after_finish,
                hook_kwargs=kwargs,
                settings=settings,
                key_store=key_store,
            )
        server = ServerThread(app, host=self.host, port=self.port)
        url = server.start()
        self._server = server
        self.deploy_id = str(uuid.uuid4())
        self._service_url = url
        return {"deploy_id": self.deploy_id, "url": url}

    async def stop(self) -> None:
        """Stop the server (a no-op when nothing runs)."""
        await asyncio.to_thread(self.stop_sync)

    def stop_sync(self) -> None:
        """The blocking twin of :meth:`stop`."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        self._service_url = None

    @property
    def is_running(self) -> bool:
        return self._server is not None and self._server.running


__all__ = ["LocalDeployManager", "ServerThread"]
