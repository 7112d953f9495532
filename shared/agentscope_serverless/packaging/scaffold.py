"""``agentscope-serverless init NAME``: a small project that serves, tests and packages as is.

>>> write_project(Path("/tmp/echo-bot"))   # doctest: +SKIP
'echo_bot.agent:app'
"""

from __future__ import annotations

import keyword
import re
import sys
from pathlib import Path

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.packaging.project import runtime_modules, standard_module

AGENT = '''"""The {name} agent: an AgentApp whose query handler answers each message."""

from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="{name}", app_description="Answers what you say.")


@app.query(framework="text")
async def query(self, msgs, request=None, session=None, memories=None, **kwargs):
    """Yield the reply in pieces; ``session.messages`` is the conversation so far."""
    text = msgs[-1].get_text_content() or ""
    yield "You said: "
    yield text
'''

TEST = '''"""The agent answers in process, without a server."""

import asyncio

from {package}.agent import app


def test_the_agent_answers() -> None:
    async def ask() -> str:
        response = await app.query("hello", user_id="u1", session_id="s1")
        await app.stop()
        return response.output[-1].get_text_content() or ""

    assert asyncio.run(ask()) == "You said: hello"
'''

README = """# {name}

An agent served as an HTTPS API by AgentScope Serverless. In this folder, with the Python
environment that has AgentScope Serverless active (`source {venv}/bin/activate`, the one
this project was made with):

```bash
pip install -r requirements.txt                                # what the agent imports
agentscope-serverless serve --agent {agent} --reload      # http://127.0.0.1:8090
python -m pytest                                               # the agent's test
agentscope-serverless deploy agentrun --agent {agent} --out dist/
agentscope-serverless deploy sam build --agent {agent}
```

Add the packages the agent needs to `requirements.txt`: install them for local runs as
above; packaging installs them with the runtime for the target platform.
"""

CONFTEST = '''"""Makes the project's package importable from its tests, however pytest runs."""


def pytest_addoption(parser, pluginmanager):
    # pytest.ini sets pytest-asyncio's loop scope (unset, it warns on every run); without
    # pytest-asyncio, the setting is declared here, else pytest warns it knows no such option.
    if not pluginmanager.has_plugin("asyncio"):
        parser.addini("asyncio_default_fixture_loop_scope", "pytest-asyncio's (not installed)")
'''

PYTEST_INI = """[pytest]
testpaths = tests
asyncio_default_fixture_loop_scope = function
"""

REQUIREMENTS = "# The packages your agent imports, one per line (the runtime is already there).\n"


def package_name(name: str) -> str:
    """The Python package of project ``name``: ``my-bot`` -> ``my_bot``."""
    package = re.sub(r"\W", "_", name.strip().lower().replace("-", "_"))
    if not package or not package.isidentifier() or keyword.iskeyword(package):
        raise ConfigurationError(f"{name!r} cannot name a Python package")
    if standard_module(package) or package in runtime_modules() or package in _TAKEN:
        raise ConfigurationError(
            f"{name!r} would name the package {package!r}, which Python or the runtime already "
            f"has: the project could not import its agent (try {package + '_agent'!r})"
        )
    return package


# The project's own folder of tests, which a package of its name would be merged with; and
# packages an agent project commonly requires (AgentScope's agents, the OpenAI SDK, A2A's),
# which a build would then refuse for the project's package shadowing them.
_TAKEN = frozenset({"tests", "agentscope", "openai", "a2a"})


def write_project(target: Path) -> str:
    """Write the project into the new (or empty) folder ``target``, named after it (``.``: the
    working directory's name); returns its agent's import path."""
    name = target.resolve().name
    package = package_name(name)
    if target.exists() and any(target.iterdir()):
        raise ConfigurationError(f"{target} exists and is not empty")
    agent = f"{package}.agent:app"
    files = {
        f"{package}/__init__.py": f'"""The {name} agent."""\n',
        f"{package}/agent.py": AGENT.format(name=name),
        "tests/test_agent.py": TEST.format(package=package),
        "requirements.txt": REQUIREMENTS,
        "README.md": README.format(name=name, agent=agent, venv=Path(sys.prefix)),
        "conftest.py": CONFTEST,
        "pytest.ini": PYTEST_INI,
        # Secrets of local runs (.env, .env.local...) stay out of the repository too.
        ".gitignore": ".venv/\n__pycache__/\ndist/\n.aws-sam/\n.env\n.env.*\n!.env.example\n",
    }
    for relative, text in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return agent


__all__ = ["package_name", "write_project"]
