"""``Services``: the services of one application, typed, built once by the composition root.

>>> from agentscope_serverless.services.memory import InMemoryMemoryService
>>> services = Services(memory=InMemoryMemoryService())
>>> services.manager().list_services()
['memory']

The runner, the web application and its routers reach their services through this
container (``services.memory`` is a :class:`MemoryService` or None). :class:`ServiceManager`
stays the AgentScope-compatible facade over the same instances: it starts and stops them
together and answers ``manager.get("memory")``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.runs.base import RunsService
from agentscope_serverless.services.session_history.base import SessionHistoryService

if TYPE_CHECKING:
    from agentscope_serverless.services.sandbox.service import SandboxService

SERVICE_NAMES = ("session_history", "memory", "state", "runs", "sandbox")


@dataclass(frozen=True)
class Services:
    """The services an application uses; a missing one is None."""

    session_history: SessionHistoryService | None = None
    memory: MemoryService | None = None
    state: StateService | None = None
    runs: RunsService | None = None
    sandbox: SandboxService | None = None

    @classmethod
    def of(cls, manager: ServiceManager) -> Services:
        """The typed view of ``manager``'s services named ``session_history``, ``memory``,
        ``state``, ``runs`` and ``sandbox`` (other names are left to the manager)."""
        expected: dict[str, type] = {
            "session_history": SessionHistoryService,
            "memory": MemoryService,
            "state": StateService,
            "runs": RunsService,
        }
        if manager.has_service("sandbox"):
            # Imported only when present: most functions have no sandbox.
            from agentscope_serverless.services.sandbox.service import SandboxService

            expected["sandbox"] = SandboxService
        found: dict[str, Any] = {}
        for name, kind in expected.items():
            service = manager.get(name)
            if service is None:
                continue
            if not isinstance(service, kind):
                raise ConfigurationError(
                    f"the {name!r} service must be a {kind.__name__}, not {type(service).__name__}"
                )
            found[name] = service
        return cls(**found)

    def manager(self) -> ServiceManager:
        """A :class:`ServiceManager` over these services (in the order of the fields)."""
        manager = ServiceManager()
        for name, service in self.items():
            manager.register_service(name, service)
        return manager

    def items(self) -> list[tuple[str, Any]]:
        """``(name, service)`` for every service present."""
        return [
            (f.name, getattr(self, f.name))
            for f in fields(self)
            if getattr(self, f.name) is not None
        ]


__all__ = ["SERVICE_NAMES", "Services"]
