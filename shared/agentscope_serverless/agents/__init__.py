"""Agents that ship with the project, and the tool protocol they share.

- :mod:`agentscope_serverless.agents.demo`: a demo agent that needs no network
  (``agentscope_serverless.agents.demo:app``).
- :mod:`agentscope_serverless.agents.llm`: an agent on any OpenAI-compatible chat API, with
  tools (``agentscope_serverless.agents.llm:app``; imports httpx, so it is not imported here).
- :class:`AgentTool`: a tool an agent can call.
"""

from agentscope_serverless.agents.tools import AgentTool, ToolCallable

__all__ = ["AgentTool", "ToolCallable"]
