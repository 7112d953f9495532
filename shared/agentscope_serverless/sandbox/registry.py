"""``SandboxRegistry``: which sandbox class serves which type (AgentScope's registry).

>>> from agentscope_serverless.sandbox import BaseSandbox
>>> SandboxRegistry.get_classes_by_type("base") is BaseSandbox
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentscope_serverless.sandbox.enums import SandboxType

C = TypeVar("C", bound=type)


@dataclass(frozen=True)
class SandboxConfig:
    """A registered sandbox class and what AgentScope records with it."""

    sandbox_class: type
    sandbox_type: SandboxType
    image_name: str
    security_level: str = "medium"
    timeout: int = 300
    description: str = ""
    environment: dict[str, str] = field(default_factory=dict)


class SandboxRegistry:
    """Sandbox classes by type; ``register`` is a class decorator."""

    _configs: dict[SandboxType, SandboxConfig] = {}

    @classmethod
    def register(
        cls,
        image_name: str,
        sandbox_type: SandboxType | str,
        security_level: str = "medium",
        timeout: int = 300,
        description: str = "",
        environment: dict[str, str] | None = None,
        **_: Any,
    ) -> Callable[[C], C]:
        """Register the decorated class for ``sandbox_type``."""

        def decorate(target: C) -> C:
            kind = SandboxType(sandbox_type)
            cls._configs[kind] = SandboxConfig(
                sandbox_class=target,
                sandbox_type=kind,
                image_name=image_name,
                security_level=security_level,
                timeout=timeout,
                description=description,
                environment=dict(environment or {}),
            )
            return target

        return decorate

    @classmethod
    def get_classes_by_type(cls, sandbox_type: SandboxType | str) -> type | None:
        """The class registered for ``sandbox_type``, or None."""
        config = cls.get_config_by_type(sandbox_type)
        return config.sandbox_class if config is not None else None

    @classmethod
    def get_config_by_type(cls, sandbox_type: SandboxType | str) -> SandboxConfig | None:
        """What was registered for ``sandbox_type``, or None."""
        return cls._configs.get(SandboxType(sandbox_type))

    @classmethod
    def list_registered_types(cls) -> list[SandboxType]:
        """Every registered type."""
        return list(cls._configs)


__all__ = ["SandboxConfig", "SandboxRegistry"]
