"""An agent's code that calls ``sys.exit()`` (a script's habit, a CLI library's) ends neither
the function's process nor the turn: the runtime would lose the container, and a caller would
get a bare 502 at every cold start.

The handler is the process function's (``functions/process/agentscope_handler.py``), with the
agent written in a temporary folder, as a user's own project is."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.http.lambda_handler import LambdaHandler, make_handler
from agentscope_serverless.log import logger
from agentscope_serverless.services.runs.base import RunRecord
from tests.support.http import issue_key
from tests.support.lambda_runtime import function_url_event


@pytest.fixture
def agent_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A folder on the import path for the agent's module, and a key of the function."""
    keys = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys), "exit-user")
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(keys))
    monkeypatch.setenv("SESSION_HISTORY_BACKEND", "in_memory")
    monkeypatch.setenv("RUNS_BACKEND", "in_memory")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path, key


def _process(handler: LambdaHandler, key: str, **body: Any) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    request = {"input": [{"role": "user", "content": "Weather?"}], **body}
    event = function_url_event("POST", "/process", headers=headers, body=json.dumps(request))
    return handler(event, None)


def test_an_agent_module_exiting_as_it_is_imported_answers_503_naming_why(
    agent_project: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, key = agent_project
    (folder / "exits_on_import.py").write_text(
        "import sys\nsys.exit('WEATHER_API_KEY is not set')\n"
    )
    monkeypatch.setenv("AGENT_APP", "exits_on_import:app")
    monkeypatch.delitem(sys.modules, "exits_on_import", raising=False)
    handler = make_handler(["process"])
    answer = _process(handler, key)  # raising SystemExit would end the runtime's process
    assert answer["statusCode"] == 503, answer
    assert json.loads(answer["body"])["error"]["code"] == "UNAVAILABLE"
    from agentscope_serverless.app import load_agent_app
    from agentscope_serverless.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as refused:
        load_agent_app("exits_on_import:app")
    assert "exits_on_import" in str(refused.value)
    assert "WEATHER_API_KEY is not set" in str(refused.value)


def test_an_agent_module_raising_with_a_secret_at_cold_start_never_shows_it(
    agent_project: tuple[Path, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder, key = agent_project
    (folder / "leaks_on_import.py").write_text(
        "import os\n"
        "key = os.environ['LLM_API_KEY']\n"
        "raise RuntimeError(f'could not log in with {key}')\n"
    )
    monkeypatch.setenv("LLM_API_KEY", "sk-COLDSTART-LEAK-3141592")
    monkeypatch.setenv("AGENT_APP", "leaks_on_import:app")
    monkeypatch.delitem(sys.modules, "leaks_on_import", raising=False)
    handler = make_handler(["process"])
    level = logger.level
    logger.setLevel("ERROR")  # the tests log nothing below CRITICAL
    try:
        answer = _process(handler, key)
    finally:
        logger.setLevel(level)
    assert answer["statusCode"] == 503, answer
    logged = capsys.readouterr()
    assert "could not log in with ***" in logged.out, logged.out
    assert "COLDSTART-LEAK" not in json.dumps(answer) + logged.out + logged.err


def test_an_agent_exiting_during_its_turn_fails_the_run_and_the_function_goes_on(
    agent_project: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, key = agent_project
    (folder / "exits_in_turn.py").write_text(
        "import sys\n"
        "from agentscope_serverless.app import AgentApp\n"
        "app = AgentApp(app_name='exits')\n"
        "@app.query(framework='text')\n"
        "async def query(self, msgs, **kwargs):\n"
        "    yield 'Looking it up'\n"
        "    sys.exit('the weather tool gave up')\n"
    )
    monkeypatch.setenv("AGENT_APP", "exits_in_turn:app")
    monkeypatch.delitem(sys.modules, "exits_in_turn", raising=False)
    handler = make_handler(["process", "sessions"])
    for stream in (False, True):
        answer = _process(handler, key, stream=stream, session_id=f"exit-{stream}")
        # Answered as any agent's failure is (not streamed: the 500 of an unknown error).
        assert answer["statusCode"] == (200 if stream else 500), answer
        last = answer["body"] if not stream else answer["body"].split("data: ")[-1]
        ended = json.loads(last)
        assert ended["status"] == "failed", ended
        assert "the weather tool gave up" in ended["error"]["message"]
        headers = {"authorization": f"Bearer {key}"}
        session = handler(
            function_url_event("GET", f"/sessions/exit-{stream}", headers=headers), None
        )
        assert session["statusCode"] == 200, session
        assert "Weather?" in session["body"]  # the user's input is kept, as for any failure


def test_a_background_task_exiting_fails_the_task_and_the_function_goes_on(
    agent_project: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, _ = agent_project
    (folder / "exiting_tasks.py").write_text(
        "import sys\n"
        "from agentscope_serverless.app import AgentApp\n"
        "app = AgentApp(app_name='exiting-tasks')\n"
        "@app.query(framework='text')\n"
        "async def query(self, msgs, **kwargs):\n"
        "    yield 'ok'\n"
        "@app.task('/jobs/report')\n"
        "async def report(payload):\n"
        "    sys.exit('no report today')\n"
        "@app.task('/jobs/export')\n"
        "def export(payload):\n"
        "    sys.exit(3)\n"
    )
    monkeypatch.setenv("AGENT_APP", "exiting_tasks:app")
    monkeypatch.delitem(sys.modules, "exiting_tasks", raising=False)
    handler = make_handler(["process"])
    health = handler(function_url_event("GET", "/health"), None)
    assert health["statusCode"] == 200, health
    runs = handler._app.state.context.runs  # type: ignore[attr-defined]
    loop = handler._loop  # type: ignore[attr-defined]
    for path, said in [("/jobs/report", "no report today"), ("/jobs/export", "3")]:
        task_id = f"task_{path.rsplit('/', 1)[-1]}"
        record = RunRecord(id=task_id, user_id="exit-user", kind="task", name=path)
        loop.run_until_complete(runs.create_run(record))
        spec = {"path": path, "user_id": "exit-user", "task_id": task_id, "payload": {}}
        # As the tasks function gets it: an asynchronous invocation's event.
        assert handler({"agentscope_task": spec}, None) == {"status": "done"}
        stored = loop.run_until_complete(runs.get_run("exit-user", task_id))
        assert stored.status == "failed", stored
        assert stored.error["message"] == f"SystemExit: {said}"
