"""The JSON log lines stay bounded, whatever a client sends: one per request at INFO, each
value of a line cut to a bounded length, still one valid JSON object."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.http import create_app
from agentscope_serverless.log import MAX_PATH_CHARS, logger
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, running


@pytest.fixture
def info_logs() -> Iterator[None]:
    """The logger at INFO for one test (the tests log nothing below CRITICAL)."""
    level = logger.level
    logger.setLevel("INFO")
    try:
        yield
    finally:
        logger.setLevel(level)


def logged(capfd: pytest.CaptureFixture[str]) -> list[tuple[str, dict[str, Any]]]:
    return [(line, json.loads(line)) for line in capfd.readouterr().out.splitlines() if line]


def test_a_long_path_is_cut_in_the_request_line(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    keys = Keys.make()
    path = "/sessions/" + "a" * 50_000 + "-end"
    with running(create_app(["sessions"], settings=load_settings(), key_store=keys.store)) as url:
        capfd.readouterr()
        # Refused (no key): the caller need not even be one of the users.
        assert httpx.get(f"{url}{path}").status_code == 401
    ((text, line),) = logged(capfd)
    assert line["status"] == 401 and line["method"] == "GET"
    assert line["path"].startswith("/sessions/aaaa") and line["path"].endswith("aaa-end")
    assert "characters cut" in line["path"]
    assert len(line["path"]) < MAX_PATH_CHARS + 50 and len(text) < MAX_PATH_CHARS + 400
