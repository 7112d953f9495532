"""The LLM agent reads the settings its runner was given, and says at start when it has no key."""

from __future__ import annotations

import asyncio

import pytest

from agentscope_serverless.agents.llm import create_llm_app
from agentscope_serverless.settings import load_settings

pytestmark = pytest.mark.usefixtures("warnings_logged")  # these tests read the warnings


def start_and_stop(api_key: str | None, capfd: pytest.CaptureFixture[str]) -> str:
    app = create_llm_app()
    app.settings = load_settings(llm_api_key=api_key, llm_base_url="http://127.0.0.1:9/v1")

    async def cycle() -> None:
        await app.start()
        await app.stop()

    asyncio.run(cycle())
    return capfd.readouterr().out


def test_without_an_api_key_the_agent_warns_naming_the_setting_and_the_secret_field(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LLM_API_KEY", raising=False)
    out = start_and_stop(None, capfd)
    assert "LLM_API_KEY" in out and "llm_api_key" in out and "SECRETS_ARN" in out


def test_with_an_api_key_from_its_settings_it_does_not_warn(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LLM_API_KEY", raising=False)
    out = start_and_stop("sk-given-by-the-root", capfd)
    assert "LLM_API_KEY" not in out
    assert "sk-given-by-the-root" not in out
