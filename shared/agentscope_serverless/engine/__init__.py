"""AgentScope Runtime's ``engine`` level, for code ported by renaming the package alone.

``agentscope_runtime.engine.X`` is ``agentscope_serverless.X`` here; code whose imports had
only ``agentscope_runtime`` replaced by ``agentscope_serverless`` keeps ``engine`` in them,
and ``agentscope_serverless.engine.X`` is that same module (the same classes), imported when
first used:

>>> from agentscope_serverless.engine.services.memory import InMemoryMemoryService
>>> from agentscope_serverless.services import memory
>>> InMemoryMemoryService is memory.InMemoryMemoryService
True
>>> from agentscope_serverless.engine import AgentApp
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import agentscope_serverless

_ALIAS = __name__ + "."
_PACKAGE = agentscope_serverless.__name__ + "."


class _SamePackage(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``agentscope_serverless.engine.X`` as the module ``agentscope_serverless.X``."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_ALIAS):
            return None
        real = _PACKAGE + fullname[len(_ALIAS) :]
        try:
            module = importlib.import_module(real)
        except ModuleNotFoundError as exc:
            if exc.name == real:
                return None
            raise
        return importlib.machinery.ModuleSpec(
            fullname, self, is_package=hasattr(module, "__path__")
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = sys.modules[_PACKAGE + spec.name[len(_ALIAS) :]]
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system gave the module the alias's spec: it keeps its own.
        module.__spec__ = self._specs.pop(module.__name__)


if not any(isinstance(finder, _SamePackage) for finder in sys.meta_path):
    sys.meta_path.insert(0, _SamePackage())

__all__ = agentscope_serverless.__all__


def __getattr__(name: str) -> Any:
    return getattr(agentscope_serverless, name)
