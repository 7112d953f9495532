"""FastAPI imported for a cold start: its OpenAPI models built when first used, no pydantic v1.

FastAPI defines the models of an OpenAPI document (about forty pydantic models) when it is
imported, and building a model's validator is most of FastAPI's import time. A function uses
them only when asked for ``/openapi.json`` or ``/docs``: :func:`import_fastapi` imports FastAPI
with pydantic's ``defer_build``, so those models are built on their first use instead. Models
defined afterwards (the project's) are built as usual.

For every route model (and every encoded value), FastAPI asks whether it is a pydantic v1
model, only to refuse it: v1 models are not supported. Answering imports ``pydantic.v1``, a
whole second copy of pydantic, at the first route definition: about a seventh of FastAPI's
import time, paid by every function at cold start. No v1 model can exist before
``pydantic.v1`` is imported, so until then the answer is no without importing it; once
anything imports it, FastAPI's own check runs again.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

V1 = "pydantic.v1"
# The FastAPI modules that define models when imported.
FASTAPI_MODULES = ("fastapi", "fastapi.openapi.models", "fastapi.security")


@contextlib.contextmanager
def models_built_on_first_use() -> Iterator[None]:
    """Pydantic models defined inside the block build their validator when first used.

    A no-op on a pydantic without the default it sets (pydantic's configuration defaults).
    """
    from pydantic._internal import _config

    defaults: dict[str, Any] | None = getattr(_config, "config_defaults", None)
    if defaults is None or "defer_build" not in defaults:
        yield
        return
    previous = defaults["defer_build"]
    defaults["defer_build"] = True
    try:
        yield
    finally:
        defaults["defer_build"] = previous


def import_fastapi() -> None:
    """Import FastAPI with its models built on first use (nothing to do once it is imported),
    then install the lazy pydantic v1 probe."""
    if "fastapi" not in sys.modules:
        with models_built_on_first_use():
            for name in FASTAPI_MODULES:
                importlib.import_module(name)
    skip_pydantic_v1_probe()


def _unless_v1_imported(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def probe(value: Any) -> bool:
        return V1 in sys.modules and check(value)

    probe.__wrapped__ = check  # type: ignore[attr-defined]
    return probe


def skip_pydantic_v1_probe() -> None:
    """Install the lazy probe in FastAPI (idempotent; a no-op on a FastAPI without it)."""
    from fastapi import encoders
    from fastapi._compat import shared

    for module, name in (
        (shared, "is_pydantic_v1_model_class"),
        (shared, "is_pydantic_v1_model_instance"),
        (encoders, "is_pydantic_v1_model_instance"),
    ):
        check = getattr(module, name, None)
        if check is not None and not hasattr(check, "__wrapped__"):
            setattr(module, name, _unless_v1_imported(check))


__all__ = ["import_fastapi", "models_built_on_first_use", "skip_pydantic_v1_probe"]
