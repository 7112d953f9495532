"""A chat model that is never called (the scripted agent needs none)."""

from __future__ import annotations

from typing import Any


class DashScopeChatModel:
    def __init__(self, model_name: str, api_key: str | None = None, **kwargs: Any) -> None:
        self.model_name = model_name
