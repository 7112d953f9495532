"""AgentScope's sandbox tools by module, for ``SandboxService.connect(tools=...)``.

As AgentScope Runtime's ``agentscope_runtime.sandbox.tools`` did, each module offers the
tools of one sandbox type; ``connect`` infers the sandbox types from them::

    from agentscope_serverless.sandbox.tools.filesystem import read_file

    sandboxes = sandbox_service.connect(session_id, user_id, tools=[read_file])

:mod:`.base` has ``run_ipython_cell`` and ``run_shell_command`` (a ``base`` sandbox),
:mod:`.filesystem` the file tools (a ``filesystem`` sandbox). Each is a
:class:`~agentscope_serverless.services.sandbox.tools.ToolDefinition`. The browser, GUI and
mobile tools are not offered (their modules raise an ``ImportError`` saying so): the sandbox
server runs ``base`` and ``filesystem`` sandboxes.
"""
