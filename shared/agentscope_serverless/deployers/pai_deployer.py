"""AgentScope's Alibaba Cloud PAI deployer, which is not offered here."""

raise ImportError(
    "PAIDeployManager (Alibaba Cloud PAI) is not offered: deploy to AWS Lambda with "
    "agentscope_serverless.deployers.SAMDeployManager, build an AgentRun or ModelStudio archive "
    "with agentscope_serverless.deployers.AgentRunDeployManager or ModelstudioDeployManager, "
    "or serve on this machine with agentscope_serverless.deployers.LocalDeployManager"
)
