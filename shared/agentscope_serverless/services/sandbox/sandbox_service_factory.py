"""``SandboxServiceFactory``: backend ``default`` (a remote sandbox server with ``base_url``
and ``bearer_token``, or the embedded one without)::

    service = await SandboxServiceFactory.create(base_url="https://...", bearer_token="...")
"""

from __future__ import annotations

from typing import ClassVar

from agentscope_serverless.services.sandbox.service import SandboxService
from agentscope_serverless.services.service_factory import ServiceFactory


class SandboxServiceFactory(ServiceFactory[SandboxService]):
    """Builds sandbox services; environment prefix ``SANDBOX_``."""

    _env_prefix: ClassVar[str] = "SANDBOX_"
    _default_backend: ClassVar[str] = "default"


SandboxServiceFactory.register_backend("default", SandboxService)

__all__ = ["SandboxService", "SandboxServiceFactory", "ServiceFactory"]
