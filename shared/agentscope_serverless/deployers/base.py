"""``DeployManager``: the interface of every way to deploy an agent.

>>> class Printer(DeployManager):
...     async def deploy(self, *args, **kwargs): return {"deploy_id": "1", "url": "http://x"}
...     async def stop(self): ...
...     @property
...     def is_running(self): return False
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class DeployManager(ABC):
    """Deploys a service, then reports where it runs and stops it."""

    def __init__(self) -> None:
        self.deploy_id: str | None = None
        self._service_url: str | None = None

    @abstractmethod
    async def deploy(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Deploy the service; return at least ``{"deploy_id": ..., "url": ...}``.

        ``url`` is None when the deployer built something without running it anywhere.
        """

    @abstractmethod
    async def stop(self) -> None:
        """Stop the deployed service."""

    @property
    @abstractmethod
    def is_running(self) -> bool:
        """Whether the service is up."""

    @property
    def service_url(self) -> str | None:
        """The URL of the running service, or None."""
        return self._service_url if self.is_running else None


__all__ = ["DeployManager"]
