"""A run's events (a large reply) are let go as its answer ends: neither the connection that
asked for it (kept alive) nor a reference cycle (freed only by a garbage collection, which
a few large replies do not bring) holds them."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.recorder import RecordedRun, RunRecorder
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, running, stream, user_message

_PIECE = "x" * 65536


def _slow_app() -> AgentApp:
    """Pieces of text past the runs store's first write delay (its writer and the watcher
    of its cancellation start)."""
    app = AgentApp(app_name="pieces")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        for _ in range(8):
            yield _PIECE
            await asyncio.sleep(0.02)

    return app


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.make()


@pytest.fixture(scope="module")
def url(keys: Keys) -> Iterator[str]:
    web = create_app(settings=load_settings(), agent_app=_slow_app(), key_store=keys.store)
    with running(web) as served:
        yield served


@pytest.fixture
def started_runs(monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[RecordedRun]]:
    """Weak references to the runs started from now on."""
    runs: list[weakref.ref[RecordedRun]] = []
    start = RunRecorder.start

    async def recording(self: RunRecorder, *args: Any, **kwargs: Any) -> RecordedRun:
        run = await start(self, *args, **kwargs)
        runs.append(weakref.ref(run))
        return run

    monkeypatch.setattr(RunRecorder, "start", recording)
    return runs


@pytest.fixture
def without_collections() -> Iterator[None]:
    """No automatic garbage collection: what is freed is freed by reference counting."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _released(run: weakref.ref[RecordedRun]) -> bool:
    """Whether ``run`` is gone, once the server has finished with it (its answer ends
    before its last lines run)."""
    for _ in range(100):
        if run() is None:
            return True
        time.sleep(0.02)
    return False


def _run_to_its_end(client: httpx.Client) -> None:
    body = {"input": [user_message("go")], "session_id": f"s-{uuid.uuid4().hex[:8]}"}
    response, sse = stream(client, "/process", json=body)
    assert response.status_code == 200
    assert sse.events[-1][1]["status"] == "completed"


@pytest.mark.parametrize("idempotency_key", [None, "released-1"])
def test_a_connection_kept_alive_does_not_hold_its_last_run(
    url: str,
    keys: Keys,
    started_runs: list[weakref.ref[RecordedRun]],
    idempotency_key: str | None,
) -> None:
    headers = bearer(keys.alice)
    if idempotency_key is not None:
        headers["Idempotency-Key"] = f"{idempotency_key}-{uuid.uuid4().hex}"
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        _run_to_its_end(client)
        (run,) = started_runs
        gc.collect()
        # The connection is still open, waiting for the client's next request.
        assert _released(run)


def test_a_finished_run_is_freed_without_a_garbage_collection(
    url: str,
    keys: Keys,
    started_runs: list[weakref.ref[RecordedRun]],
    without_collections: None,
) -> None:
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        _run_to_its_end(client)
    (run,) = started_runs
    assert _released(run)
