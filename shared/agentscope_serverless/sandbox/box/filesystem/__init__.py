"""AgentScope's ``agentscope_runtime.sandbox.box.filesystem``."""

from agentscope_serverless.sandbox.box.filesystem.filesystem_sandbox import (
    FilesystemSandbox,
    FilesystemSandboxAsync,
)

__all__ = ["FilesystemSandbox", "FilesystemSandboxAsync"]
