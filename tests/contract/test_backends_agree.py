"""CONTRACT §2 and §4, differentially: the same calls on every backend give the same answers.

Sequences of calls are generated (hypothesis) and run against the in-memory store, Redis and
DynamoDB (moto's server), each sequence for a user of its own; every answer and every error
must be the same on all of them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentscope_serverless.errors import AgentScopeServerlessError
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services.agent_state import StateService
from agentscope_serverless.services.session_history import SessionHistoryService

BACKENDS = ["in_memory", "redis", "dynamodb"]
# Ids that look like the stores' key separators, with other characters keys must survive.
SESSION_IDS = ["s1", "a:b", "{s}", "#1", "%00", "e\u0301", "\U0001f600", "\u202eabc"]
MESSAGE_IDS = [f"m{i}" for i in range(6)]

Op = tuple[Any, ...]

history_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.sampled_from(SESSION_IDS),
            st.lists(st.sampled_from(MESSAGE_IDS), min_size=1, max_size=4),
        ),
        st.tuples(st.just("get"), st.sampled_from(SESSION_IDS)),
        st.tuples(st.just("open"), st.sampled_from(SESSION_IDS), st.integers(0, 8)),
        st.tuples(st.just("pages"), st.sampled_from(SESSION_IDS), st.integers(1, 4)),
        st.tuples(st.just("list"), st.integers(1, 3)),
        st.tuples(st.just("delete"), st.sampled_from(SESSION_IDS)),
        st.tuples(st.just("create"), st.sampled_from(SESSION_IDS)),
    ),
    min_size=1,
    max_size=12,
)

state_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children),
    max_leaves=8,
)
state_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("save"),
            st.sampled_from([None, *SESSION_IDS[:3]]),
            st.dictionaries(st.text(max_size=4), state_values, max_size=3),
            st.sampled_from([None, None, 1, 2, 5, 2**53 - 1]),
        ),
        st.tuples(
            st.just("export"),
            st.sampled_from([None, *SESSION_IDS[:3]]),
            st.sampled_from([None, 1, 2, 5]),
        ),
        st.tuples(st.just("rounds"), st.sampled_from([None, *SESSION_IDS[:3]])),
        st.tuples(st.just("delete"), st.sampled_from([None, *SESSION_IDS[:3]])),
    ),
    min_size=1,
    max_size=10,
)


async def answer(call: Any) -> Any:
    """What a call gave: its value as plain data, or the kind of error it raised."""
    try:
        value = await call
    except AgentScopeServerlessError as exc:
        return ("error", exc.code, str(exc))
    if isinstance(value, list):
        return [getattr(item, "id", item) for item in value]
    return value


def texts(messages: list[Any]) -> list[str | None]:
    return [m.get_text_content() for m in messages]


async def message_pages(
    service: SessionHistoryService, user_id: str, session_id: str, limit: int
) -> list[Any]:
    """The texts of each page of a session's messages (or the error reading them gave)."""
    pages: list[Any] = []
    cursor = None
    while True:
        page = await answer(service.list_messages(user_id, session_id, limit=limit, cursor=cursor))
        if isinstance(page, tuple):
            return [*pages, page]
        pages.append(texts(page.items))
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


async def session_pages(service: SessionHistoryService, user_id: str, limit: int) -> list[Any]:
    """The ids of each page of the user's sessions."""
    pages: list[Any] = []
    cursor = None
    while True:
        listed = await service.list_sessions_page(user_id, limit=limit, cursor=cursor)
        pages.append([s.id for s in listed.items])
        if listed.next_cursor is None:
            return pages
        cursor = listed.next_cursor


async def run_history(service: SessionHistoryService, user_id: str, ops: list[Op]) -> list[Any]:
    answers: list[Any] = []
    for kind, *args in ops:
        if kind == "append":
            session = Session(id=args[0], user_id=user_id)
            await service.append_message(
                session,
                [{"id": m, "role": "user", "content": f"{m} #{len(answers)}"} for m in args[1]],
            )
            answers.append(texts(session.messages))
        elif kind == "get":
            read = await service.get_session(user_id, args[0])
            answers.append(None if read is None else texts(read.messages))
        elif kind == "open":
            opened = await service.open_session(user_id, args[0], recent=args[1])
            answers.append(texts(opened.messages))
        elif kind == "pages":
            answers.append(await message_pages(service, user_id, args[0], args[1]))
        elif kind == "list":
            answers.append(await session_pages(service, user_id, args[0]))
        elif kind == "delete":
            await service.delete_session(user_id, args[0])
        else:
            answers.append((await service.create_session(user_id, args[0])).id)
    return answers


@pytest.fixture(params=[None, 2], ids=["unbounded", "kept_to_two"])
async def histories(
    request: pytest.FixtureRequest,
) -> AsyncIterator[dict[str, SessionHistoryService]]:
    """A started session history on each backend (with ``max_messages_per_session``)."""
    options = {"max_messages_per_session": request.param}
    async with AsyncExitStack() as stack:
        services = {}
        for backend in BACKENDS:
            factory: Callable[..., SessionHistoryService] = request.getfixturevalue(
                f"session_history_{backend}_factory"
            )
            services[backend] = await stack.enter_async_context(factory(**options))
        yield services


@pytest.fixture
async def states(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, StateService]]:
    """A started state service on each backend."""
    async with AsyncExitStack() as stack:
        services = {}
        for backend in BACKENDS:
            factory: Callable[[], StateService] = request.getfixturevalue(
                f"state_{backend}_factory"
            )
            services[backend] = await stack.enter_async_context(factory())
        yield services


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=history_ops)
# An append repeated: the window after it, and messages it repeats while they are kept.
@example(ops=[("append", "s1", ["m0", "m1"]), ("append", "s1", ["m0", "m1"]), ("open", "s1", 2)])
@example(ops=[("append", "s1", ["m0", "m1"]), ("append", "s1", ["m1", "m0"]), ("get", "s1")])
async def test_session_history_answers_the_same_on_every_backend(
    histories: dict[str, SessionHistoryService], ops: list[Op]
) -> None:
    user_id = f"user-{uuid.uuid4().hex[:12]}"
    answers = {
        backend: await run_history(service, user_id, ops) for backend, service in histories.items()
    }
    assert answers["redis"] == answers["in_memory"]
    assert answers["dynamodb"] == answers["in_memory"]


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=state_ops)
async def test_state_answers_the_same_on_every_backend(
    states: dict[str, StateService], ops: list[Op]
) -> None:
    user_id = f"user-{uuid.uuid4().hex[:12]}"
    answers: dict[str, list[Any]] = {}
    for backend, service in states.items():
        got = answers[backend] = []
        for kind, session_id, *args in ops:
            if kind == "save":
                got.append(await answer(service.save_state(user_id, args[0], session_id, args[1])))
            elif kind == "export":
                got.append(await answer(service.export_state(user_id, session_id, args[0])))
            elif kind == "rounds":
                got.append(await answer(service.list_rounds(user_id, session_id)))
            else:
                got.append(await answer(service.delete_state(user_id, session_id)))
    assert answers["redis"] == answers["in_memory"]
    assert answers["dynamodb"] == answers["in_memory"]
