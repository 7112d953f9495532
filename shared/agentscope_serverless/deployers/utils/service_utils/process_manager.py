"""AgentScope's manager of detached server processes, which is not offered here."""

raise ImportError(
    "ProcessManager (detached server processes) is not offered: "
    "agentscope_serverless.deployers.LocalDeployManager serves an app in this process and "
    "stops it with stop()"
)
