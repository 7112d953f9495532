"""``ProtocolAdapter``: adds a protocol's endpoint to a web application.

>>> class Echo(ProtocolAdapter):
...     def add_endpoint(self, app, func, **kwargs):
...         app.add_api_route("/echo", func, methods=["POST"])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any


class ProtocolAdapter(ABC):
    """A protocol served next to ``/process``; options are kept in ``self.kwargs``."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    @abstractmethod
    def add_endpoint(self, app: Any, func: Callable[..., Any], **kwargs: Any) -> Any:
        """Add the protocol's routes to ``app``, calling ``func`` (the agent) per request."""


def refuse_protocol_adapters(adapters: Iterable[Any] | None) -> None:
    """Raise :class:`TypeError` naming the protocol adapters given whose routes a deployment
    would not serve: every one but AgentScope's ``ResponseAPIDefaultAdapter`` (whose API every
    app serves already). A deployer here adds no adapter's routes: an app's own go in its
    module, with ``@app.endpoint`` or on ``app.get_fastapi_app()``."""
    from agentscope_serverless.deployers.adapter.responses.response_api_protocol_adapter import (
        ResponseAPIDefaultAdapter,
    )

    others = [
        type(adapter).__name__
        for adapter in adapters or ()
        if not isinstance(adapter, ResponseAPIDefaultAdapter)
    ]
    if others:
        raise TypeError(
            f"protocol adapters are not supported: {', '.join(others)} (an app serves "
            "/process, the OpenAI Responses and Chat Completions APIs and A2A itself; add "
            "routes of its own with @app.endpoint(path) or on app.get_fastapi_app())"
        )


__all__ = ["ProtocolAdapter", "refuse_protocol_adapters"]
