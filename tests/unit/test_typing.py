"""An agent developer's code type-checks against the installed package, as mypy sees it from
outside (PEP 561): the package ships its annotations (``py.typed``), and a service used as
an async context manager does not swallow exceptions, so a ``return`` inside its block
ends the function."""

from __future__ import annotations

from pathlib import Path

from mypy import api

AGENT_CODE = """
from agentscope_serverless.services import ServiceManager
from agentscope_serverless.services.session_history import InMemorySessionHistoryService


async def sessions(user_id: str) -> int:
    async with InMemorySessionHistoryService() as history:
        return len(await history.list_sessions(user_id))


async def has_memory() -> bool:
    async with ServiceManager() as manager:
        return manager.has_service("memory")
"""


def test_agent_code_using_services_passes_mypy_strict(tmp_path: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT_CODE)
    config = tmp_path / "mypy.ini"  # not the repository's, which reads the sources directly
    config.write_text("[mypy]\n")
    report, errors, status = api.run(
        [
            str(agent),
            "--strict",
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )
    assert status == 0, report + errors
