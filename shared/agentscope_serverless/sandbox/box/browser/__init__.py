"""AgentScope's browser sandbox (``agentscope_runtime.sandbox.box.browser``),
which is not offered here: importing it, or a module of it, says what to use instead."""

from agentscope_serverless.not_offered import not_offered

raise not_offered("BrowserSandbox")
