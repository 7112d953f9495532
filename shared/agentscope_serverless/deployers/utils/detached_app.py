"""AgentScope's detached-process projects, which are not offered here."""

from agentscope_serverless.not_offered import not_offered

raise not_offered("build_detached_app")
