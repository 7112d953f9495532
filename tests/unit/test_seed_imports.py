"""The seeds' import paths exist with the one prefix changed (CONTRACT, top)."""

from __future__ import annotations

import importlib

import pytest

SEED_IMPORTS = {
    "services.base": ["Service", "ServiceLifecycleManagerMixin", "ServiceWithLifecycleManager"],
    "services.manager": ["ServiceManager"],
    "services.session_history": ["InMemorySessionHistoryService", "SessionHistoryService"],
    "services.session_history_service": [
        "InMemorySessionHistoryService",
        "Session",
        "SessionHistoryService",
    ],
    "services.memory": ["InMemoryMemoryService", "MemoryService"],
    "services.memory_service": ["InMemoryMemoryService", "MemoryService"],
    "services.agent_state": ["InMemoryStateService", "StateService"],
    "services.agent_state.state_service": ["InMemoryStateService"],
    "schemas.session": ["Session"],
    "schemas.agent_schemas": [
        "AgentRequest",
        "AgentResponse",
        "Content",
        "ContentType",
        "DataContent",
        "Error",
        "Event",
        "FunctionCall",
        "FunctionCallOutput",
        "FunctionTool",
        "ImageContent",
        "Message",
        "MessageType",
        "Role",
        "RunStatus",
        "TextContent",
        "Tool",
    ],
}


@pytest.mark.parametrize("module", sorted(SEED_IMPORTS))
def test_seed_module_exports_the_seed_names(module: str) -> None:
    imported = importlib.import_module(f"agentscope_serverless.{module}")
    for name in SEED_IMPORTS[module]:
        assert getattr(imported, name) is not None, f"{module}.{name}"


def test_importing_the_services_does_not_import_store_clients() -> None:
    import subprocess
    import sys

    code = (
        "import sys, agentscope_serverless.services.session_history, "
        "agentscope_serverless.services.memory, agentscope_serverless.services.agent_state, "
        "agentscope_serverless.services.factory; "
        "print(sorted(m for m in ('redis', 'aioboto3', 'botocore') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
