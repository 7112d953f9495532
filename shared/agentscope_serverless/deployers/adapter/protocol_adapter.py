"""``ProtocolAdapter``: adds a protocol's endpoint to a web application.

>>> class Echo(ProtocolAdapter):
...     def add_endpoint(self, app, func, **kwargs):
...         app.add_api_route("/echo", func, methods=["POST"])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any


class ProtocolAdapter(ABC):
    """A protocol served next to ``/process``; options are kept in ``self.kwargs``."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    @abstractmethod
    def add_endpoint(self, app: Any, func: Callable[..., Any], **kwargs: Any) -> Any:
        """Add the protocol's routes to ``app``, calling ``func`` (the agent) per request."""


__all__ = ["ProtocolAdapter"]
