"""AgentScope adapters: session-history-backed memory, message conversion, sandbox tools.

- :mod:`.message`: ``agentscope_msg_to_message`` and ``message_to_agentscope_msg``.
- :mod:`.memory`: ``AgentScopeSessionHistoryMemory`` (an AgentScope memory kept in a
  session history service).
- :mod:`.long_term_memory`: ``AgentScopeLongTermMemory`` (an AgentScope long-term memory
  kept in a memory service).
- :mod:`.tool`: ``sandbox_tool_adapter`` (a sandbox tool as an AgentScope tool function).

Importing this package does not import ``agentscope``; its modules do.
"""
