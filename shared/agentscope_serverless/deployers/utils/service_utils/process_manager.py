"""AgentScope's manager of detached server processes, which is not offered here."""

from agentscope_serverless.not_offered import not_offered

raise not_offered("ProcessManager")
