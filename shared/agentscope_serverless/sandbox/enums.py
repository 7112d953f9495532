"""``SandboxType``: AgentScope's sandbox types (``agentscope_runtime.sandbox.enums``).

Our sandbox server offers ``base`` and ``filesystem`` (and their ``*_async`` names, the same
sandboxes); asking it for another type is refused with the list of the types it offers.

>>> SandboxType("filesystem") is SandboxType.FILESYSTEM
True
"""

from __future__ import annotations

from enum import StrEnum


class SandboxType(StrEnum):
    """The sandbox types of AgentScope Runtime 1.0.5 (values are the wire names)."""

    DUMMY = "dummy"
    BASE = "base"
    BROWSER = "browser"
    FILESYSTEM = "filesystem"
    GUI = "gui"
    MOBILE = "mobile"
    APPWORLD = "appworld"
    BFCL = "bfcl"
    AGENTBAY = "agentbay"
    BASE_ASYNC = "base_async"
    BROWSER_ASYNC = "browser_async"
    FILESYSTEM_ASYNC = "filesystem_async"
    GUI_ASYNC = "gui_async"
    MOBILE_ASYNC = "mobile_async"


__all__ = ["SandboxType"]
