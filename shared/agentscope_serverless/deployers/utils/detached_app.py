"""AgentScope's detached-process projects, which are not offered here."""

raise ImportError(
    "detached-process projects (build_detached_app) are not offered: "
    "agentscope_serverless.deployers.LocalDeployManager serves an app in this process, and "
    "agentscope_serverless.deployers.AgentRunDeployManager or ModelstudioDeployManager build "
    "an archive of a project"
)
