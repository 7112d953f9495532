"""AgentScope's ``agentscope_runtime.sandbox.box.base``."""

from agentscope_serverless.sandbox.box.base.base_sandbox import BaseSandbox, BaseSandboxAsync

__all__ = ["BaseSandbox", "BaseSandboxAsync"]
