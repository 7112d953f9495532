"""AgentScope's Alibaba Cloud PAI deployer, which is not offered here."""

from agentscope_serverless.not_offered import not_offered

raise not_offered("PAIDeployManager")
