"""The runtime's import paths follow the seeds, and the HTTP modules stay light to import."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

SEED_IMPORTS = {
    "deployers": ["DeployManager", "LocalDeployManager"],
    "deployers.base": ["DeployManager"],
    "deployers.local_deployer": ["LocalDeployManager"],
    "runner": ["Runner"],
    "app": ["AgentApp"],
    "app.agent_app": ["AgentApp"],
}


@pytest.mark.parametrize("module", sorted(SEED_IMPORTS))
def test_seed_module_exports_the_seed_names(module: str) -> None:
    imported = importlib.import_module(f"agentscope_serverless.{module}")
    for name in SEED_IMPORTS[module]:
        assert getattr(imported, name) is not None, f"{module}.{name}"


def test_the_http_app_imports_only_mounted_routers_and_no_servers_clis_or_sdks() -> None:
    code = (
        "import sys; from agentscope_serverless.http import create_app; create_app(['state']); "
        "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
        "if m.startswith('agentscope_serverless.http.routers.'))); "
        "import agentscope_serverless.runner, agentscope_serverless.agents.demo; "
        "create_app(['process']); "
        "print(sorted(m for m in ('uvicorn', 'typer', 'rich', 'openai', 'agentscope', 'httpx', "
        "'redis', 'aioboto3') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["['health', 'state']", "[]"]
