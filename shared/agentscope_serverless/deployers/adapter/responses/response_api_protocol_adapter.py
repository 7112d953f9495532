"""AgentScope's ``ResponseAPIDefaultAdapter``: the responses API, served with ``/process``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentscope_serverless.deployers.adapter.protocol_adapter import ProtocolAdapter


class ResponseAPIDefaultAdapter(ProtocolAdapter):
    """The responses API; always served with ``/process``."""

    def add_endpoint(self, app: Any, func: Callable[..., Any], **kwargs: Any) -> Any:
        """Nothing to add: the route is part of every process app."""
        return None


__all__ = ["ResponseAPIDefaultAdapter"]
