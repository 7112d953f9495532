"""FastAPI without its pydantic v1 probe, so a cold start does not import a second pydantic.

For every route model (and every encoded value), FastAPI asks whether it is a pydantic v1
model, only to refuse it: v1 models are not supported. Answering imports ``pydantic.v1``, a
whole second copy of pydantic, at the first route definition: about a seventh of FastAPI's
import time, paid by every function at cold start. No v1 model can exist before
``pydantic.v1`` is imported, so until then the answer is no without importing it; once
anything imports it, FastAPI's own check runs again.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

V1 = "pydantic.v1"


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


__all__ = ["skip_pydantic_v1_probe"]
