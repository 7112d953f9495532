"""Sandboxes for agents' tools: Python, shell and files on a sandbox server.

>>> from agentscope_serverless.services.sandbox import SandboxService
>>> service = SandboxService()  # embedded local server; or SandboxService(base_url, token)

Modules: :mod:`.service` (``SandboxService``), :mod:`.box` (the ``Sandbox`` handle),
:mod:`.client` (the protocol client), :mod:`.tools` (tool definitions for agents and
models), :mod:`.embedded` (the local server used without a base URL).
"""

from agentscope_serverless.services.sandbox.box import Sandbox
from agentscope_serverless.services.sandbox.client import SandboxClient
from agentscope_serverless.services.sandbox.sandbox_service_factory import SandboxServiceFactory
from agentscope_serverless.services.sandbox.service import SandboxService
from agentscope_serverless.services.sandbox.tools import (
    BUILTIN_TOOLS,
    ToolDefinition,
    infer_sandbox_types,
    openai_tools,
    result_text,
)

__all__ = [
    "BUILTIN_TOOLS",
    "Sandbox",
    "SandboxClient",
    "SandboxService",
    "SandboxServiceFactory",
    "ToolDefinition",
    "infer_sandbox_types",
    "openai_tools",
    "result_text",
]
