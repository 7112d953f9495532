"""AgentScope's Nacos registry of A2A agents, which is not offered here."""

from agentscope_serverless.not_offered import not_offered

raise not_offered("NacosRegistry")
