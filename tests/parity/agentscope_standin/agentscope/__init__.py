"""A stand-in for the ``agentscope`` package (not installed here): the few names AgentScope
Runtime's README quickstart uses, with a scripted agent in place of the LLM-driven one.

``ReActAgent`` keeps no model: it reads the user's last message, remembers a name it is told
in its state, answers from that state, and writes both messages to its memory, as the real
agent does through the memory it is given.
"""
