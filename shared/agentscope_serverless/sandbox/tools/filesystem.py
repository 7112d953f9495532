"""The tools of a ``filesystem`` sandbox, on files of its workspace.

>>> read_file.sandbox_type
'filesystem'
"""

from agentscope_serverless.services.sandbox.tools import get_tool

read_file = get_tool("read_file")
read_multiple_files = get_tool("read_multiple_files")
write_file = get_tool("write_file")
edit_file = get_tool("edit_file")
create_directory = get_tool("create_directory")
list_directory = get_tool("list_directory")
directory_tree = get_tool("directory_tree")
move_file = get_tool("move_file")
search_files = get_tool("search_files")
get_file_info = get_tool("get_file_info")
list_allowed_directories = get_tool("list_allowed_directories")

__all__ = [
    "create_directory",
    "directory_tree",
    "edit_file",
    "get_file_info",
    "list_allowed_directories",
    "list_directory",
    "move_file",
    "read_file",
    "read_multiple_files",
    "search_files",
    "write_file",
]
