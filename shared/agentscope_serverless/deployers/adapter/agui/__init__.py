"""AgentScope's AG-UI protocol adapter, which is not offered here."""

raise ImportError(
    "the AG-UI protocol adapter is not offered: an app serves /process (SSE), the OpenAI "
    "Responses and Chat Completions APIs and A2A itself (agentscope_serverless.app.AgentApp)"
)
