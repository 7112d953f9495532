"""Our sandbox server: a separate program speaking AgentScope's sandbox manager protocol.

Run it with ``agentscope-sandbox-server`` (see :mod:`.cli`). It shares only the protocol
models (:mod:`agentscope_serverless.sandbox_protocol`) with the sandbox client.
"""
