"""AgentScope adapters: session-history-backed memory, message conversion, sandbox tools.

- :mod:`.message`: ``agentscope_msg_to_message`` and ``message_to_agentscope_msg``.
- :mod:`.memory`: ``AgentScopeSessionHistoryMemory`` (an AgentScope memory kept in a
  session history service).
- :mod:`.long_term_memory`: ``AgentScopeLongTermMemory`` (an AgentScope long-term memory
  kept in a memory service).
- :mod:`.tool`: ``sandbox_tool_adapter`` (a sandbox tool as an AgentScope tool function).

Importing this package does not import ``agentscope``; its modules do, and without it they
raise :class:`AgentScopeMissingError` (a ``ModuleNotFoundError``) saying what to install.
"""

from __future__ import annotations


class AgentScopeMissingError(ModuleNotFoundError):
    """An adapter module imported without the ``agentscope`` package installed."""


def agentscope_missing(module: str, error: ModuleNotFoundError) -> ModuleNotFoundError:
    """What importing ``module`` raises when its import of AgentScope failed with ``error``:
    an :class:`AgentScopeMissingError` naming the extra to install when ``agentscope``
    itself is missing, else ``error`` (a module AgentScope needs, say)::

        try:
            from agentscope.message import Msg
        except ModuleNotFoundError as exc:
            raise agentscope_missing(__name__, exc) from None
    """
    if error.name != "agentscope":
        return error
    return AgentScopeMissingError(
        f"{module} needs the agentscope package (1.x, as AgentScope Runtime 1.0.5): "
        "pip install 'agentscope-serverless[agentscope]'",
        name="agentscope",
    )


__all__ = ["AgentScopeMissingError", "agentscope_missing"]
