"""AgentScope's mobile sandbox tools, which are not offered here."""

raise ImportError(
    "mobile sandbox tools are not offered: the sandbox server runs 'base' and 'filesystem' "
    "sandboxes (tools in agentscope_serverless.sandbox.tools.base and .filesystem)"
)
