"""AgentScope's Nacos registry of A2A agents, which is not offered here."""

raise ImportError(
    "NacosRegistry (A2A registries) is not offered: every app serves A2A at its own URL, its "
    "agent card at /.well-known/agent-card.json, configured by "
    "agentscope_serverless.deployers.adapter.a2a.AgentCardWithRuntimeConfig"
)
