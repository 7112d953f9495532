"""AgentScope's ``agentscope_runtime.sandbox.box``: the sandbox classes."""

from agentscope_serverless.sandbox.box.sandbox import Sandbox, SandboxAsync, SandboxBase

__all__ = ["Sandbox", "SandboxAsync", "SandboxBase"]
