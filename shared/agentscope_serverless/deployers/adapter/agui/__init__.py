"""AgentScope's AG-UI protocol adapter, which is not offered here."""

from agentscope_serverless.not_offered import not_offered

raise not_offered("AGUIDefaultAdapter")
