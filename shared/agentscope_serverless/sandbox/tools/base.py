"""The tools of a ``base`` sandbox: Python and the shell.

>>> run_ipython_cell.sandbox_type
'base'
"""

from agentscope_serverless.services.sandbox.tools import get_tool

run_ipython_cell = get_tool("run_ipython_cell")
run_shell_command = get_tool("run_shell_command")

__all__ = ["run_ipython_cell", "run_shell_command"]
