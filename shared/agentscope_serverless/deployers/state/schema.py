"""AgentScope's module path of :class:`Deployment`, a record of one deployment."""

from agentscope_serverless.deployers.base import Deployment

__all__ = ["Deployment"]
