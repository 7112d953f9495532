"""AgentScope's module path of :class:`FastAPIAppFactory`, which builds an app's web
application."""

from agentscope_serverless.app.agent_app import FastAPIAppFactory

__all__ = ["FastAPIAppFactory"]
