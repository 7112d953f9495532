"""The examples in the package's docstrings run and give what they show.

A ``>>>`` example is a promise to whoever reads the docstring; one that cannot run (it needs
a server, or awaits outside a function) is written as a literal block (``::``) instead.
"""

from __future__ import annotations

import contextvars
import doctest
import importlib
import pkgutil

import pytest

import agentscope_serverless
from agentscope_serverless import log

# Modules that refuse to be imported here, each for a reason of its own: AgentScope's
# adapters need the ``agentscope`` package (an extra); the sandbox tools of sandbox types the
# server does not run, and AgentScope's modules of what is not ported, say so as they are
# imported.
NOT_IMPORTABLE = {
    "agentscope_serverless.adapters.agentscope.long_term_memory": "agentscope",
    "agentscope_serverless.adapters.agentscope.memory": "agentscope",
    "agentscope_serverless.adapters.agentscope.message": "agentscope",
    "agentscope_serverless.adapters.agentscope.tool": "agentscope",
    "agentscope_serverless.sandbox.tools.browser": "not offered",
    "agentscope_serverless.sandbox.tools.gui": "not offered",
    "agentscope_serverless.sandbox.tools.mobile": "not offered",
    **dict.fromkeys(
        [
            "agentscope_serverless.app.base_app",
            "agentscope_serverless.app.celery_mixin",
            "agentscope_serverless.deployers.adapter.a2a.nacos_a2a_registry",
            "agentscope_serverless.deployers.adapter.agui",
            "agentscope_serverless.deployers.knative_deployer",
            "agentscope_serverless.deployers.kubernetes_deployer",
            "agentscope_serverless.deployers.pai_deployer",
            "agentscope_serverless.deployers.utils.detached_app",
            "agentscope_serverless.deployers.utils.service_utils.process_manager",
            "agentscope_serverless.sandbox.box.agentbay",
            "agentscope_serverless.sandbox.box.browser",
            "agentscope_serverless.sandbox.box.cloud",
            "agentscope_serverless.sandbox.box.dummy",
            "agentscope_serverless.sandbox.box.gui",
            "agentscope_serverless.sandbox.box.mobile",
            "agentscope_serverless.sandbox.box.training_box",
        ],
        "not offered",
    ),
}
MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(
        agentscope_serverless.__path__, prefix="agentscope_serverless."
    )
)


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_of_each_module_run(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name in NOT_IMPORTABLE:
        with pytest.raises(ImportError, match=NOT_IMPORTABLE[name]):
            importlib.import_module(name)
        return
    module = importlib.import_module(name)
    # With no secret masked yet: one an earlier test gave (a token "token") would show in
    # an example's line ("?***=").
    monkeypatch.setattr(log, "_SECRETS", frozenset())
    monkeypatch.setattr(log, "_REDACTED", ())
    # In a context of their own: what an example sets (a request id) stays out of the
    # tests that run after it in this process.
    result = contextvars.copy_context().run(
        doctest.testmod, module, optionflags=doctest.ELLIPSIS, verbose=False, report=True
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"
