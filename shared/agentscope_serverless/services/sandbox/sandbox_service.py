"""AgentScope's module path of the sandbox service."""

from agentscope_serverless.services.base import ServiceWithLifecycleManager
from agentscope_serverless.services.sandbox.service import SandboxService

__all__ = ["SandboxService", "ServiceWithLifecycleManager"]
