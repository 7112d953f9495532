"""Every in-scope module and public name of AgentScope Runtime 1.0.5's engine exists at its
ported path (``agentscope_runtime.engine.X`` -> ``agentscope_serverless.X``) and accepts the
calls written for it: same parameter names, the same positions, nothing more required."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest

from tests.parity.reference import (
    OUT_OF_SCOPE_METHODS,
    OUT_OF_SCOPE_MODULES,
    Entry,
    in_scope,
    incompatibilities,
    our_module,
    parse,
)

LISTING = parse()
MODULES = [m for m in LISTING.modules if m not in OUT_OF_SCOPE_MODULES]
ENTRIES = [e for e in LISTING.entries if in_scope(e)]


def _signature(obj: Any) -> inspect.Signature:
    return inspect.signature(obj)


def test_the_listing_is_parsed_whole() -> None:
    assert len(LISTING.modules) == 37
    assert len(LISTING.entries) > 200
    assert sum(len(e.methods) for e in LISTING.entries) > 120


@pytest.mark.parametrize("module", MODULES)
def test_every_reference_module_imports_at_its_ported_path(module: str) -> None:
    importlib.import_module(our_module(module))


@pytest.mark.parametrize("module", MODULES)
def test_every_reference_module_imports_with_only_the_package_name_changed(module: str) -> None:
    # A port by renaming the package alone keeps ``engine`` in the path: it is the same
    # module (the same classes) as the path without it.
    renamed = importlib.import_module(module.replace("agentscope_runtime", "agentscope_serverless"))
    ours = importlib.import_module(our_module(module))
    if module == "agentscope_runtime.engine":
        assert all(getattr(renamed, name) is getattr(ours, name) for name in ours.__all__)
    else:
        assert renamed is ours


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.module}:{e.name}")
def test_every_reference_name_exists_with_a_compatible_signature(entry: Entry) -> None:
    module = importlib.import_module(our_module(entry.module))
    assert hasattr(module, entry.name), f"{our_module(entry.module)} has no {entry.name}"
    ours = getattr(module, entry.name)
    if entry.kind == "lazy":
        return
    if entry.kind == "class":
        assert inspect.isclass(ours), f"{entry.name} is not a class"
    else:
        assert callable(ours) and not inspect.isclass(ours), f"{entry.name} is not a function"
    assert entry.params is not None
    problems = incompatibilities(entry.params, _signature(ours))
    assert not problems, f"{entry.name}{_signature(ours)}: {problems}"
    for method in entry.methods:
        if method.name in OUT_OF_SCOPE_METHODS:
            continue
        where = f"{entry.name}.{method.name}"
        assert hasattr(ours, method.name), f"no {where}"
        attribute = inspect.getattr_static(ours, method.name)
        if method.params is None:
            assert isinstance(attribute, property), f"{where} is not a property"
            continue
        function = getattr(ours, method.name)
        if method.is_async:
            assert inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function), (
                f"{where} is not async"
            )
        else:
            assert not inspect.iscoroutinefunction(function), f"{where} is async here"
        problems = incompatibilities(method.params, _signature(function))
        assert not problems, f"{where}{_signature(function)}: {problems}"


def test_out_of_scope_names_are_few_and_named() -> None:
    skipped = sorted({e.name for e in LISTING.entries if not in_scope(e)})
    assert len(skipped) < 40, skipped


def test_the_package_and_the_adapters_import_lazily() -> None:
    import subprocess
    import sys

    code = (
        "import sys, agentscope_serverless, agentscope_serverless.adapters.agentscope; "
        "print(sorted(m for m in ('agentscope', 'agentscope_serverless.app', 'fastapi', "
        "'agentscope_serverless.runner') if m in sys.modules)); "
        "agentscope_serverless.AgentApp; "
        "print('agentscope_serverless.app' in sys.modules, 'uvicorn' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "True False"]
