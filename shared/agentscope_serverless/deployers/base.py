"""``DeployManager``: the interface of every way to deploy an agent.

>>> class Printer(DeployManager):
...     async def deploy(self, *args, **kwargs): return {"deploy_id": "1", "url": "http://x"}
...     async def stop(self, deploy_id=None, **kwargs): ...
"""

from __future__ import annotations

import contextlib
import enum
import sys
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from agentscope_serverless.errors import ConfigurationError


class DeploymentMode(enum.StrEnum):
    """How a local deployment runs (AgentScope's names; we run in a daemon thread)."""

    DAEMON_THREAD = "daemon_thread"
    DETACHED_PROCESS = "detached_process"
    STANDALONE = "standalone"


@dataclass
class Deployment:
    """A record of one deployment."""

    id: str
    platform: str
    url: str
    agent_source: str
    created_at: str
    status: str = "running"
    token: str | None = None
    config: dict[str, Any] = field(default_factory=dict)


class DeployManager(ABC):
    """Deploys a service, then reports where it runs and stops it.

    ``state_manager`` (AgentScope's record of past deployments) is kept as given.
    """

    def __init__(self, state_manager: Any = None) -> None:
        self.state_manager = state_manager
        self.deploy_id: str | None = str(uuid.uuid4())
        self._service_url: str | None = None

    @abstractmethod
    async def deploy(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Deploy the service; return at least ``{"deploy_id": ..., "url": ...}``.

        ``url`` is None when the deployer built something without running it anywhere.
        """

    @abstractmethod
    async def stop(self, deploy_id: str | None = None, **kwargs: Any) -> Any:
        """Stop the deployed service (``deploy_id``: the one this manager deployed)."""

    @property
    def is_running(self) -> bool:
        """Whether the service is up (False unless a subclass knows better: AgentScope's
        deployers implement ``deploy`` and ``stop`` alone)."""
        return False

    @property
    def service_url(self) -> str | None:
        """The URL of the running service, or None."""
        return self._service_url if self.is_running else None


def _module_holding(app: Any) -> tuple[str, ModuleType, str] | None:
    """The first imported module (not the script run) with ``app`` at its top level: its
    name, the module and the attribute."""
    main = sys.modules.get("__main__")
    for name, module in list(sys.modules.items()):
        # The script run is named by its file, not as ``__main__`` nor as ``__mp_main__``,
        # the alias multiprocessing gives it once anything imports it.
        if module is None or module is main:
            continue
        for attribute, value in list(vars(module).items()):
            if value is app:
                return name, module, attribute
    return None


def default_project_root(app: Any) -> Path:
    """The project of ``app`` when none is given: the folder of the script run by its path
    (``python bot/agent.py``: ``bot/``, where Python imports it and its neighbours from) when
    the app is the script's or a module's imported from there, else the working directory.
    """
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if isinstance(app, str) or script is None or getattr(main, "__spec__", None) is not None:
        return Path.cwd().resolve()  # python -m, a shell, a notebook: the import path's
    folder = Path(script).resolve().parent
    held = _module_holding(app)
    if held is not None:
        name, module, _ = held
        file = getattr(module, "__file__", None)
        if file is None:
            return Path.cwd().resolve()
        path = Path(file).resolve()
        # mypkg/agent.py as mypkg.agent is imported from the folder above mypkg/.
        imported_from = path.parents[name.count(".") + (path.name == "__init__.py")]
        return folder if imported_from == folder else Path.cwd().resolve()
    return folder


def import_path_of(app: Any, project_root: Path | None = None) -> str:
    """``module:attribute`` of ``app``: as given when it is text, else the name an importable
    module gives the app object at its top level. An app of the script being run
    (``python agent.py``, whose ``__main__`` calls ``app.deploy(...)``) is named by the
    script's module in ``project_root`` (default: the working directory).
    """
    if isinstance(app, str):
        return app
    held = _module_holding(app)
    if held is not None:
        return f"{held[0]}:{held[2]}"
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    attributes = [a for a, v in list(vars(main).items()) if v is app] if main else []
    if script and attributes:
        root = (project_root or Path.cwd()).resolve()
        with contextlib.suppress(ValueError):  # a script outside the project
            relative = Path(script).resolve().with_suffix("").relative_to(root)
            return f"{'.'.join(relative.parts)}:{attributes[0]}"
    raise ConfigurationError(
        "the app must be a top-level attribute of a module of the project (or pass "
        "'module:attribute')"
    )


__all__ = [
    "DeployManager",
    "Deployment",
    "DeploymentMode",
    "default_project_root",
    "import_path_of",
]
