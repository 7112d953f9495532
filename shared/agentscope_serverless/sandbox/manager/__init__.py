"""AgentScope's ``agentscope_runtime.sandbox.manager``: :class:`SandboxManager`."""

from agentscope_serverless.sandbox.manager.sandbox_manager import SandboxManager

__all__ = ["SandboxManager"]
