"""AgentScope's sandbox client (``agentscope_runtime.sandbox``) over our sandbox server.

Change the import prefix and the code runs::

    from agentscope_serverless.sandbox import BaseSandbox, FilesystemSandbox

    with FilesystemSandbox(base_url="http://sandbox-host:8000", bearer_token=token) as box:
        box.write_file("notes.md", "# Notes")
        box.edit_file("notes.md", [{"oldText": "Notes", "newText": "Plans"}])

Offered: ``BaseSandbox``, ``FilesystemSandbox`` and their ``*Async`` forms, ``SandboxManager``
(every operation of the protocol, sync and ``*_async``), ``SandboxType`` and
``SandboxRegistry``. The browser, GUI, mobile, training, cloud and AgentBay sandboxes are not:
our server offers the ``base`` and ``filesystem`` types (importing one of them, or its
module, raises an ``ImportError`` saying so and what to use). Errors raise
:class:`~agentscope_serverless.errors.SandboxError` instead of coming back as strings.
"""

from typing import Any

from agentscope_serverless.not_offered import missing_name
from agentscope_serverless.sandbox.box.base.base_sandbox import BaseSandbox, BaseSandboxAsync
from agentscope_serverless.sandbox.box.filesystem.filesystem_sandbox import (
    FilesystemSandbox,
    FilesystemSandboxAsync,
)
from agentscope_serverless.sandbox.box.sandbox import Sandbox, SandboxAsync
from agentscope_serverless.sandbox.enums import SandboxType
from agentscope_serverless.sandbox.manager.sandbox_manager import SandboxManager
from agentscope_serverless.sandbox.registry import SandboxRegistry


def __getattr__(name: str) -> Any:
    raise missing_name(__name__, name)


__all__ = [
    "BaseSandbox",
    "BaseSandboxAsync",
    "FilesystemSandbox",
    "FilesystemSandboxAsync",
    "Sandbox",
    "SandboxAsync",
    "SandboxManager",
    "SandboxRegistry",
    "SandboxType",
]
