"""AgentScope Runtime's README quickstart runs here with only its import prefixes changed.

The quickstart (``quickstart/agentscope_readme_quickstart.py.txt``, as published) needs the
``agentscope`` package, which is not installed here: ``agentscope_standin/`` provides the
names it imports, with a scripted ``ReActAgent`` in place of the LLM-driven one. The app is
served as the quickstart serves it (``agent_app.run``, on a free port instead of 8090) and
talked to over HTTP for two turns: the agent's state (in the state service assigned in
``@agent_app.init``) and its memory (``AgentScopeSessionHistoryMemory`` on the session
service assigned there) carry from the first turn to the second.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentscope_serverless.auth.file import FileKeyStore
from tests.support.http import bearer, free_port, issue_key, stream, text_of, wait_until_healthy

HERE = Path(__file__).parent
QUICKSTART = HERE / "quickstart" / "agentscope_readme_quickstart.py.txt"
STANDIN = HERE / "agentscope_standin"
PREFIXES = {
    "agentscope_runtime.engine": "agentscope_serverless",
    "agentscope_runtime.adapters": "agentscope_serverless.adapters",
}


def ported(source: str) -> str:
    """The porting rule: the import prefixes replaced, nothing else."""
    for old, new in PREFIXES.items():
        source = source.replace(f"from {old} import", f"from {new} import")
        source = source.replace(f"from {old}.", f"from {new}.")
    return source


def test_the_port_changes_only_import_lines() -> None:
    original = QUICKSTART.read_text().splitlines()
    changed = [
        (a, b)
        for a, b in zip(original, ported(QUICKSTART.read_text()).splitlines(), strict=True)
        if a != b
    ]
    assert changed and all(a.startswith("from agentscope_runtime.") for a, _ in changed)
    assert "agentscope_runtime" not in ported(QUICKSTART.read_text())


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    port = free_port()
    source = ported(QUICKSTART.read_text()).replace("port=8090", f"port={port}")
    (tmp_path / "friday.py").write_text(source)
    keys = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys), "alice")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]),
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(keys),
        "POWERTOOLS_LOG_LEVEL": "CRITICAL",
    }
    process = subprocess.Popen(
        [sys.executable, "friday.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        yield url, key
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_two_turns_keep_the_agents_state_and_memory(served: tuple[str, str]) -> None:
    url, key = served
    session = f"qs-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        first, sse = stream(client, "/process", json=_turn("My name is Alice", session))
        assert first.status_code == 200
        assert text_of(sse.data) == "Nice to meet you, Alice!"
        assert sse.data[-1]["status"] == "completed"
        second, sse = stream(client, "/process", json=_turn("What is my name?", session))
        assert second.status_code == 200
        # The name comes from the saved state; 3 = both messages of the first turn and the
        # new question, read back through the session-history-backed memory.
        assert text_of(sse.data) == "Your name is Alice. (3 messages so far)"
        _, sse = stream(client, "/process", json=_turn("What is my name?", session + "x"))
        assert text_of(sse.data) == "Your name is None. (1 messages so far)"


def _turn(text: str, session_id: str) -> dict[str, object]:
    return {
        "input": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "session_id": session_id,
        "user_id": "alice",
    }
