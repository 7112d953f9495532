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
    OUT_OF_SCOPE_NAMES,
    SANDBOX_PACKAGE,
    Entry,
    in_scope,
    incompatibilities,
    our_module,
    parse,
)

LISTING = parse()
MODULES = [m for m in LISTING.modules if m not in OUT_OF_SCOPE_MODULES]
ENTRIES = [e for e in LISTING.entries if in_scope(e)]
# The modules AgentScope defines its names in ("[defined in X]"), which code imports from as
# well as from the modules re-exporting them; a module none of whose names is in scope is not
# offered, and says so when imported.
DEFINED_IN: dict[str, set[str]] = {}
for _entry in LISTING.entries:
    if _entry.defined_in and _entry.name not in OUT_OF_SCOPE_NAMES:
        DEFINED_IN.setdefault(_entry.defined_in, set()).add(_entry.name)
NOT_OFFERED = sorted(
    {e.defined_in for e in LISTING.entries if e.defined_in and e.defined_in not in DEFINED_IN}
    | set(OUT_OF_SCOPE_MODULES)
)


def _signature(obj: Any) -> inspect.Signature:
    return inspect.signature(obj)


def test_the_listing_is_parsed_whole() -> None:
    assert len(LISTING.modules) == 37
    assert len(LISTING.entries) > 200
    assert sum(len(e.methods) for e in LISTING.entries) > 120


# Names an engine module imports from AgentScope's sandbox package (``SandboxManager`` in
# ``...services.sandbox.sandbox_service``): the ported sandbox package's own objects.
SANDBOX_NAMES = [
    e
    for e in LISTING.entries
    if (e.defined_in or "").startswith(SANDBOX_PACKAGE) and e.module not in OUT_OF_SCOPE_MODULES
]


@pytest.mark.parametrize("entry", SANDBOX_NAMES, ids=lambda e: f"{e.module}.{e.name}")
def test_names_imported_from_the_sandbox_package_are_there_too(entry: Entry) -> None:
    # ``from ...sandbox_service import SandboxType`` was a bare ImportError.
    listed = importlib.import_module(our_module(entry.module))
    assert getattr(listed, entry.name) is getattr(
        importlib.import_module(our_module(entry.defined_in)), entry.name
    )


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


@pytest.mark.parametrize("module", sorted(DEFINED_IN))
def test_every_module_a_name_is_defined_in_imports_with_it(module: str) -> None:
    ours = importlib.import_module(our_module(module))
    for name in sorted(DEFINED_IN[module]):
        assert hasattr(ours, name), f"{our_module(module)} has no {name}"
    renamed = module.replace("agentscope_runtime", "agentscope_serverless")
    assert importlib.import_module(renamed) is ours
    # The same object as where the listing names it, not a copy.
    for entry in ENTRIES:
        if entry.defined_in == module and entry.kind != "lazy":
            listed = importlib.import_module(our_module(entry.module))
            assert getattr(listed, entry.name) is getattr(ours, entry.name), entry.name


@pytest.mark.parametrize("module", NOT_OFFERED)
def test_a_module_not_offered_says_so_and_what_to_use_instead(module: str) -> None:
    with pytest.raises(ImportError) as raised:
        importlib.import_module(our_module(module))
    message = str(raised.value)
    assert "not offered" in message and "agentscope_serverless." in message, message
    # Renaming the package alone reaches the same refusal.
    with pytest.raises(ImportError, match="not offered"):
        importlib.import_module(module.replace("agentscope_runtime", "agentscope_serverless"))


NOT_OFFERED_NAMES = sorted(
    {
        (our_module(module), e.name)
        for e in LISTING.entries
        for module in (e.module, e.defined_in)
        if e.name in OUT_OF_SCOPE_NAMES
        and module is not None
        and module not in OUT_OF_SCOPE_MODULES
        and module not in NOT_OFFERED
    }
)


@pytest.mark.parametrize(("module", "name"), NOT_OFFERED_NAMES)
def test_a_name_not_offered_says_so_and_what_to_use_instead(module: str, name: str) -> None:
    with pytest.raises(ImportError) as raised:
        exec(f"from {module} import {name}", {})
    message = str(raised.value)
    assert name in message and "not offered" in message, message
    assert "agentscope_serverless." in message, message
    # Any other missing name is an AttributeError, as for any module.
    with pytest.raises(AttributeError):
        importlib.import_module(module).NoSuchName  # noqa: B018


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
