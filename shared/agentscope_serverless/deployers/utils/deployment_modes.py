"""AgentScope's module path of :class:`DeploymentMode`, how a local deployment runs."""

from agentscope_serverless.deployers.base import DeploymentMode

__all__ = ["DeploymentMode"]
