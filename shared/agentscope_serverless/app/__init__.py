"""The application layer: :class:`AgentApp` (``from agentscope_serverless.app import AgentApp``)."""

from agentscope_serverless.app.agent_app import AgentApp, load_agent_app

__all__ = ["AgentApp", "load_agent_app"]
