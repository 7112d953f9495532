"""The runtime's import paths follow the seeds, and the HTTP modules stay light to import."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import agentscope_serverless

PACKAGE = Path(agentscope_serverless.__file__).parent

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
        "import sys; from agentscope_serverless.http import create_app; "
        "from agentscope_serverless.settings import load_settings; s = load_settings(); "
        "create_app(['state'], settings=s); "
        "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
        "if m.startswith('agentscope_serverless.http.routers.'))); "
        "import agentscope_serverless.runner, agentscope_serverless.agents.demo; "
        "create_app(['process'], settings=s); "
        "print(sorted(m for m in ('uvicorn', 'typer', 'rich', 'openai', 'agentscope', 'httpx', "
        "'redis', 'aioboto3') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["['health', 'state']", "[]"]


def test_the_app_layer_is_defined_without_the_http_layer() -> None:
    code = (
        "import sys; import agentscope_serverless.app, agentscope_serverless.runner; "
        "print(sorted(m for m in sys.modules if m.startswith('agentscope_serverless.http')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _run(code: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_fastapi_openapi_models_are_built_when_first_used() -> None:
    code = (
        "import agentscope_serverless.http as http, fastapi.openapi.models as models; "
        "from fastapi.testclient import TestClient; "
        "from agentscope_serverless.settings import Settings, load_settings; "
        "print(models.OpenAPI.__pydantic_complete__, Settings.__pydantic_complete__); "
        "client = TestClient(http.create_app(['state'], settings=load_settings())); "
        "print(client.get('/openapi.json').json()['openapi'][:2], "
        "models.OpenAPI.__pydantic_complete__)"
    )
    assert _run(code) == ["False True", "3. True"]


def test_only_an_agent_function_imports_the_runtime_at_init() -> None:
    code = (
        "import sys; from agentscope_serverless.http.lambda_handler import make_handler; "
        "runtime = ('agentscope_serverless.app', 'agentscope_serverless.runner'); "
        "make_handler(['sessions', 'runs']); print([m in sys.modules for m in runtime]); "
        "make_handler(['process', 'users']); print([m in sys.modules for m in runtime])"
    )
    assert _run(code) == ["[False, False]", "[True, True]"]


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_no_import_circle_between_app_and_http() -> None:
    for path in (PACKAGE / "app").rglob("*.py"):
        http = {m for m in _top_level_imports(path) if m.startswith("agentscope_serverless.http")}
        assert not http, f"{path.name} imports {http} at module level"


# Where a process starts: the only places that read the settings from the environment.
COMPOSITION_ROOTS = {
    "settings.py",  # defines get_settings
    "cli.py",
    "serve.py",
    "http/lambda_handler.py",
    "app/agent_app.py",  # in-process runs and AgentApp.run()
    "runner.py",  # a Runner used on its own
    "deployers/local_deployer.py",  # serving in-process
}


def test_only_composition_roots_read_the_global_settings() -> None:
    readers = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "get_settings()" in path.read_text() or "load_settings()" in path.read_text()
    }
    assert readers <= COMPOSITION_ROOTS, readers - COMPOSITION_ROOTS
    # Below the roots, settings are an argument, never a fallback to the environment.
    for module in ("services/factory.py", "auth/factory.py", "http/app.py", "agents/llm.py"):
        assert "get_settings" not in (PACKAGE / module).read_text(), module
