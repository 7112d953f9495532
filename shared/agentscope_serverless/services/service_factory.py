"""AgentScope Runtime's service factories: a backend name and keyword arguments to a service::

    service = await SessionHistoryServiceFactory.create("redis", redis_url="redis://...")

The backend is the argument, else the environment variable ``{PREFIX}BACKEND``, else the
factory's default. Keyword arguments come from the variables ``{PREFIX}{BACKEND}_<NAME>``
(``SESSION_HISTORY_REDIS_REDIS_URL`` sets ``redis_url``), converted to the type of the
constructor's default, then from the call (which wins). Arguments the constructor does not
take are dropped. The service comes back **not started**. Register another backend with
``register_backend(name, constructor)``.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from agentscope_serverless.services.base import ServiceWithLifecycleManager

T = TypeVar("T")


class LazyBackend:
    """A backend class named by its import path, imported when first built."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"LazyBackend({self.path!r})"

    def load(self) -> Callable[..., Any]:
        module, _, name = self.path.partition(":")
        constructor: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return constructor


class ServiceFactory(Generic[T]):
    """Base of the factories: a registry of backends per factory class."""

    _registry: ClassVar[dict[str, Callable[..., Any] | LazyBackend]] = {}
    _env_prefix: ClassVar[str] = ""
    _default_backend: ClassVar[str] = "in_memory"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._registry = dict(cls._registry)

    @classmethod
    def register_backend(
        cls, backend_type: str, constructor: Callable[..., T] | LazyBackend
    ) -> None:
        """Make ``backend_type`` build services with ``constructor(**kwargs)``."""
        cls._registry[backend_type.lower()] = constructor

    @classmethod
    def backends(cls) -> list[str]:
        """The registered backend names."""
        return sorted(cls._registry)

    @classmethod
    async def create(cls, backend_type: str | None = None, **kwargs: Any) -> T:
        """A new, not yet started service of ``backend_type``."""
        backend = (
            backend_type or os.environ.get(f"{cls._env_prefix}BACKEND") or cls._default_backend
        ).lower()
        if backend not in cls._registry:
            raise ValueError(
                f"Unsupported backend type: {backend!r}; registered: {', '.join(cls.backends())}"
            )
        entry = cls._registry[backend]
        constructor = entry.load() if isinstance(entry, LazyBackend) else entry
        arguments = {**_environment_arguments(cls._env_prefix, backend, constructor), **kwargs}
        service: T = constructor(**_accepted(constructor, arguments))
        return service


def _parameters(constructor: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    """The constructor's named parameters, or None when it takes ``**kwargs``."""
    try:
        parameters = inspect.signature(constructor).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return dict(parameters)


def _accepted(constructor: Callable[..., Any], arguments: dict[str, Any]) -> dict[str, Any]:
    parameters = _parameters(constructor)
    if parameters is None:
        return arguments
    return {name: value for name, value in arguments.items() if name in parameters}


def _environment_arguments(
    prefix: str, backend: str, constructor: Callable[..., Any]
) -> dict[str, Any]:
    start = f"{prefix}{backend.upper()}_"
    parameters = _parameters(constructor) or {}
    arguments: dict[str, Any] = {}
    for variable, raw in os.environ.items():
        if variable.startswith(start) and len(variable) > len(start):
            name = variable[len(start) :].lower()
            parameter = parameters.get(name)
            default = parameter.default if parameter is not None else None
            arguments[name] = _convert(raw, default, variable)
    return arguments


def _convert(raw: str, default: Any, variable: str) -> Any:
    """``raw`` as the type of ``default`` (bool, int or float); text otherwise."""
    if isinstance(default, bool):
        if raw.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if raw.strip().lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{variable} must be true or false")
    for kind in (int, float):
        if isinstance(default, kind) or (default is None and _looks_like(raw, kind)):
            try:
                return kind(raw)
            except ValueError:
                raise ValueError(f"{variable} must be a number") from None
    return raw


def _looks_like(raw: str, kind: type) -> bool:
    try:
        kind(raw)
    except ValueError:
        return False
    return True


__all__ = ["LazyBackend", "ServiceFactory", "ServiceWithLifecycleManager"]
