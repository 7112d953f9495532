"""The base class of A2A service registries (not supported here: see
:mod:`agentscope_serverless.deployers.adapter.a2a`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class A2ARegistry(ABC):
    """A service registry the agent card would be registered with (AgentScope's base class;
    registries are not supported here, see the module's docstring)."""

    @abstractmethod
    def registry_name(self) -> str:
        """A short name of the registry (``"nacos"``)."""

    @abstractmethod
    def register(self, agent_card: Any, a2a_transports_properties: Any = None) -> None:
        """Register the agent card."""


__all__ = ["A2ARegistry"]
