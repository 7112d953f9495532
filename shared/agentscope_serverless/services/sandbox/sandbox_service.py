"""AgentScope's module path of the sandbox service (with the names it imports there)."""

from agentscope_serverless.sandbox.enums import SandboxType
from agentscope_serverless.sandbox.manager.sandbox_manager import SandboxManager
from agentscope_serverless.sandbox.registry import SandboxRegistry
from agentscope_serverless.services.base import ServiceWithLifecycleManager
from agentscope_serverless.services.sandbox.service import SandboxService

__all__ = [
    "SandboxManager",
    "SandboxRegistry",
    "SandboxService",
    "SandboxType",
    "ServiceWithLifecycleManager",
]
