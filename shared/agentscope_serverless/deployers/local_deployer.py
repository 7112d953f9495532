"""``LocalDeployManager``: serve an agent (or a plain function) on this machine, in the background.

>>> manager = LocalDeployManager(host="127.0.0.1", port=0)   # port 0: any free port
>>> # info = await manager.deploy(app)  -> {"deploy_id": "...", "url": "http://127.0.0.1:PORT",
>>> #                                          "token": "ask_..."}
>>> # await manager.stop()

The server is uvicorn, running in a thread with its own event loop, so it keeps serving
while the caller's loop (or a synchronous caller) does other things.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import uvicorn
from pydantic import BaseModel

from agentscope_serverless.app.agent_app import AgentApp, FastAPIAppFactory
from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.deployers.adapter.protocol_adapter import (
    ProtocolAdapter,
    refuse_protocol_adapters,
)
from agentscope_serverless.deployers.base import DeployManager, Deployment, DeploymentMode
from agentscope_serverless.head_timeout import (
    DEFAULT_BODY_TIMEOUT_SECONDS,
    DEFAULT_HEAD_TIMEOUT_SECONDS,
    head_timeout_protocol,
)
from agentscope_serverless.not_offered import missing_name
from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas.agent_schemas import AgentRequest
from agentscope_serverless.settings import Settings, port_number


class ServerThread:
    """An ASGI application served by uvicorn in a background thread::

    server = ServerThread(app, host="127.0.0.1", port=0)
    url = server.start()
    ...
    server.stop()
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        head_timeout: float = DEFAULT_HEAD_TIMEOUT_SECONDS,
        body_timeout: float = DEFAULT_BODY_TIMEOUT_SECONDS,
    ) -> None:
        self.host = host
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            http=head_timeout_protocol(head_timeout, body_timeout),
            log_level=log_level,
            lifespan="on",
            access_log=False,
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

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop serving (waits for in-flight requests and the application's shutdown)."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


class LocalDeployManager(DeployManager):
    """Deploys an :class:`AgentApp`, a :class:`Runner` or a plain function on ``host:port``.

    An AgentApp (or a runner, wrapped in one) gets every router (``/process``, the
    OpenAI-compatible endpoints, sessions, memory, state, ``/health``), configured on the
    AgentApp itself; a plain function is served at ``endpoint_path`` (see
    :mod:`agentscope_serverless.http.function_app`). ``settings`` and ``key_store`` default
    to those from the environment. The server runs in a daemon thread (``mode``).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8090,
        shutdown_timeout: int = 30,
        startup_timeout: int = 30,
        logger: logging.Logger | None = None,
    ) -> None:
        super().__init__()
        self.host = host
        self.port = port if port is None else port_number(port)
        self.shutdown_timeout = shutdown_timeout
        self.startup_timeout = startup_timeout
        self.logger = logger
        self._server: ServerThread | None = None
        self._is_running: bool | None = None

    async def deploy(
        self,
        app: AgentApp | Callable[..., Any] | None = None,
        runner: Runner | None = None,
        endpoint_path: str | None = None,
        request_model: type[BaseModel] | None = AgentRequest,
        response_type: str = "sse",
        stream: bool = True,
        before_start: Callable[..., Any] | None = None,
        after_finish: Callable[..., Any] | None = None,
        mode: DeploymentMode = DeploymentMode.DAEMON_THREAD,
        custom_endpoints: list[dict[str, Any]] | None = None,
        protocol_adapters: list[Any] | None = None,
        broker_url: str | None = None,
        backend_url: str | None = None,
        enable_embedded_worker: bool = False,
        project_dir: str | None = None,
        entrypoint: str | None = None,
        *,
        settings: Settings | None = None,
        key_store: KeyStore | None = None,
        **kwargs: Any,
    ) -> dict[str, str]:
        """Serve ``app`` (or ``runner``) in the background; return ``{"deploy_id", "url"}``,
        and ``"token"``: the development key made for it, on the embedded key store.

        ``endpoint_path`` defaults to the AgentApp's own (``/process`` for a function).

        For a plain function, ``kwargs`` are passed to the ``before_start``/``after_finish``
        callbacks. Celery (``broker_url``...), other modes than a daemon thread and
        ``project_dir``/``entrypoint`` are refused. A runner already started (``async with
        runner: await runner.deploy(manager)``) is stopped first and started again by the
        server, with the server's services, as AgentScope Runtime's server restarts it.
        """
        started = runner if runner is not None else getattr(app, "runner", None)
        if isinstance(started, Runner) and started.is_started and not self.is_running:
            await started.stop()
        return await asyncio.to_thread(
            self.deploy_sync,
            app,
            runner,
            endpoint_path,
            request_model,
            response_type,
            stream,
            before_start,
            after_finish,
            mode,
            custom_endpoints,
            protocol_adapters,
            broker_url,
            backend_url,
            enable_embedded_worker,
            project_dir,
            entrypoint,
            settings=settings,
            key_store=key_store,
            **kwargs,
        )

    def deploy_sync(
        self,
        app: AgentApp | Callable[..., Any] | None = None,
        runner: Runner | None = None,
        endpoint_path: str | None = None,
        request_model: type[BaseModel] | None = AgentRequest,
        response_type: str = "sse",
        stream: bool = True,
        before_start: Callable[..., Any] | None = None,
        after_finish: Callable[..., Any] | None = None,
        mode: DeploymentMode = DeploymentMode.DAEMON_THREAD,
        custom_endpoints: list[dict[str, Any]] | None = None,
        protocol_adapters: list[Any] | None = None,
        broker_url: str | None = None,
        backend_url: str | None = None,
        enable_embedded_worker: bool = False,
        project_dir: str | None = None,
        entrypoint: str | None = None,
        *,
        settings: Settings | None = None,
        key_store: KeyStore | None = None,
        **kwargs: Any,
    ) -> dict[str, str]:
        """The blocking twin of :meth:`deploy`."""
        refuse_protocol_adapters(protocol_adapters)
        if self.is_running:
            raise RuntimeError(f"already serving at {self.service_url}; stop() it first")
        if DeploymentMode(mode) is not DeploymentMode.DAEMON_THREAD:
            raise ValueError("only DeploymentMode.DAEMON_THREAD is supported")
        if broker_url or backend_url or enable_embedded_worker or project_dir or entrypoint:
            raise TypeError(
                "Celery workers and detached projects are not supported: deploy an AgentApp"
            )
        if app is None and runner is not None:
            app = AgentApp(runner=runner, endpoint_path=endpoint_path or "/process")
        if app is None:
            raise TypeError("deploy() needs an app (an AgentApp or a function) or a runner")
        if settings is None:
            # A local deployment is its process's composition root.
            from agentscope_serverless.settings import get_settings

            settings = get_settings()
        given_key_store = key_store is not None
        if key_store is None:
            from agentscope_serverless.auth.factory import create_key_store

            key_store = create_key_store(settings)
        if isinstance(app, AgentApp):
            if kwargs:
                raise TypeError(
                    f"LocalDeployManager.deploy() does not take {', '.join(sorted(kwargs))} "
                    "for an AgentApp (it serves the app in this process)"
                )
            customised = (
                endpoint_path not in (None, app.endpoint_path),
                request_model not in (None, AgentRequest, app.request_model),
                response_type != "sse",
                before_start is not None,
                after_finish is not None,
            )
            if any(customised):
                raise TypeError(
                    "an AgentApp carries its own endpoint_path, request_model and hooks: "
                    "set them on the AgentApp"
                )
            for spec in custom_endpoints or []:
                app.custom_endpoints.append(
                    {"methods": ["POST"], **spec, "handler": spec.get("handler") or spec["func"]}
                )
            from agentscope_serverless.http import create_app

            web_app = create_app(settings=settings, agent_app=app, key_store=key_store)
        else:
            from agentscope_serverless.http.function_app import create_function_app

            web_app = create_function_app(
                app,
                endpoint_path=endpoint_path or "/process",
                request_model=request_model,
                response_type=response_type,
                before_start=before_start,
                after_finish=after_finish,
                hook_kwargs=kwargs,
                settings=settings,
                key_store=key_store,
            )
        token = None
        if not given_key_store:
            from agentscope_serverless.serve import announce_development_key

            # Every route but /health needs a key: the embedded store has none.
            token = announce_development_key(key_store)
        server = ServerThread(
            web_app,
            host=self.host,
            port=self.port,
            head_timeout=settings.request_head_timeout_seconds,
            body_timeout=settings.request_body_timeout_seconds,
        )
        url = server.start(timeout=self.startup_timeout)
        self._server = server
        self._is_running = None
        self.deploy_id = str(uuid.uuid4())
        self._service_url = url
        info = {"deploy_id": self.deploy_id, "url": url}
        if token is not None:
            info["token"] = token  # where AgentScope's deployment record keeps its key
        return info

    async def stop(self, deploy_id: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Stop the server (a no-op when nothing runs)."""
        await asyncio.to_thread(self.stop_sync)
        return {"success": True, "deploy_id": deploy_id or self.deploy_id}

    def stop_sync(self) -> None:
        """The blocking twin of :meth:`stop`."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(timeout=self.shutdown_timeout)
        self._service_url = None
        self._is_running = None

    @property
    def is_running(self) -> bool:
        """Whether the server is up (settable, as in AgentScope, to record a state)."""
        if self._is_running is not None:
            return self._is_running
        return self._server is not None and self._server.running

    @is_running.setter
    def is_running(self, value: bool) -> None:
        self._is_running = bool(value)

    def is_service_running(self) -> bool:
        """Whether the server is up."""
        return self.is_running

    def get_deployment_info(self) -> dict[str, Any]:
        """Where and whether the deployment runs."""
        return {
            "deploy_id": self.deploy_id,
            "host": self.host,
            "port": self.port,
            "url": self.service_url,
            "is_running": self.is_running,
        }


def __getattr__(name: str) -> Any:
    raise missing_name(__name__, name)


__all__ = [
    "DeployManager",
    "Deployment",
    "DeploymentMode",
    "FastAPIAppFactory",
    "LocalDeployManager",
    "ProtocolAdapter",
    "ServerThread",
]
