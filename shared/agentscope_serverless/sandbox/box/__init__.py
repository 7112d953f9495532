"""AgentScope's ``agentscope_runtime.sandbox.box``: the sandbox classes."""

from typing import Any

from agentscope_serverless.not_offered import missing_name
from agentscope_serverless.sandbox.box.sandbox import Sandbox, SandboxAsync, SandboxBase


def __getattr__(name: str) -> Any:
    raise missing_name(__name__, name)


__all__ = ["Sandbox", "SandboxAsync", "SandboxBase"]
