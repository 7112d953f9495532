"""CONTRACT §1 and §2: session history, on every backend."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from agentscope_serverless.errors import (
    InvalidInputError,
    MessageIdConflictError,
    ServiceNotStartedError,
    SessionNotFoundError,
)
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.schemas.pagination import Page
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services._validation import decode_cursor
from agentscope_serverless.services.session_history import SessionHistoryService


def text_message(text: str, role: str = "user") -> Message:
    return Message(role=role, content=[TextContent(text=text)])  # type: ignore[arg-type]


def texts(session: Session | None) -> list[str | None]:
    assert session is not None
    return [m.get_text_content() for m in session.messages if isinstance(m, Message)]


# --- create_session -------------------------------------------------------------------


async def test_create_session_without_id_generates_a_uuid(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id)
    assert uuid.UUID(session.id)
    assert session.user_id == user_id
    assert session.messages == []


@pytest.mark.parametrize("blank", ["", "   ", "\t\n"])
async def test_create_session_with_blank_id_generates_a_uuid(
    history: SessionHistoryService, user_id: str, blank: str
) -> None:
    session = await history.create_session(user_id, blank)
    assert uuid.UUID(session.id)


async def test_create_session_strips_the_id(history: SessionHistoryService, user_id: str) -> None:
    session = await history.create_session(user_id, "  s1  ")
    assert session.id == "s1"
    assert await history.get_session(user_id, "s1") is not None


async def test_create_session_is_idempotent_and_keeps_history(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, text_message("hello"))
    again = await history.create_session(user_id, "s1")
    assert again.id == "s1"
    assert texts(again) == ["hello"]
    assert texts(await history.get_session(user_id, "s1")) == ["hello"]


async def test_two_sessions_without_id_are_distinct(
    history: SessionHistoryService, user_id: str
) -> None:
    first = await history.create_session(user_id)
    second = await history.create_session(user_id)
    assert first.id != second.id


# --- get_session ----------------------------------------------------------------------


async def test_get_missing_session_returns_none(
    history: SessionHistoryService, user_id: str
) -> None:
    assert await history.get_session(user_id, "nope") is None
    # and asking did not create it
    assert await history.list_sessions(user_id) == []


async def test_get_session_with_blank_id_returns_none(
    history: SessionHistoryService, user_id: str
) -> None:
    assert await history.get_session(user_id, "  ") is None


async def test_get_session_returns_full_history_in_order(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    for i in range(12):
        await history.append_message(session, text_message(f"m{i}"))
    assert texts(await history.get_session(user_id, "s1")) == [f"m{i}" for i in range(12)]


async def test_get_session_strips_the_id(history: SessionHistoryService, user_id: str) -> None:
    await history.create_session(user_id, "s1")
    assert await history.get_session(user_id, " s1 ") is not None


async def _read_back_original(history: SessionHistoryService, user_id: str) -> Session:
    """Session ``s1`` read back after "original" was appended to it."""
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, text_message("original"))
    got = await history.get_session(user_id, "s1")
    assert got is not None and isinstance(got.messages[0], Message)
    return got


async def test_get_session_returns_a_copy(history: SessionHistoryService, user_id: str) -> None:
    got = await _read_back_original(history, user_id)
    message = got.messages[0]
    assert isinstance(message, Message)
    message.content = [TextContent(text="changed")]
    got.messages.append(text_message("extra"))
    assert texts(await history.get_session(user_id, "s1")) == ["original"]


async def test_changing_a_read_message_in_place_does_not_reach_the_store(
    history: SessionHistoryService, user_id: str
) -> None:
    got = await _read_back_original(history, user_id)
    message = got.messages[0]
    assert isinstance(message, Message) and isinstance(message.content, list)
    part = message.content[0]
    assert isinstance(part, TextContent)
    part.text = "changed"
    del got.messages[:]
    assert texts(await history.get_session(user_id, "s1")) == ["original"]


async def test_a_read_session_is_the_history_at_the_time_of_the_read(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, text_message("before"))
    got = await history.get_session(user_id, "s1")
    opened = await history.open_session(user_id, "s1", recent=5)
    await history.append_message(session, text_message("after"))
    assert texts(got) == ["before"]
    assert texts(opened) == ["before"]


async def test_a_read_session_serializes_and_compares_like_one_built_by_hand(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    sent = [text_message("one"), text_message("two", role="assistant")]
    await history.append_message(session, sent)
    built = Session(id="s1", user_id=user_id, messages=list(sent))
    for read in (
        lambda: history.get_session(user_id, "s1"),
        lambda: history.open_session(user_id, "s1", recent=2),
    ):
        got = await read()
        assert got is not None
        assert got.model_dump() == built.model_dump()
        assert (await read()) == built
        assert Session.model_validate_json((await read()).model_dump_json()) == built  # type: ignore[union-attr]
        assert dict(await read())["messages"] == sent  # type: ignore[arg-type]


async def test_get_session_of_another_user_returns_none(
    history: SessionHistoryService, user_id: str
) -> None:
    await history.create_session(user_id, "s1")
    assert await history.get_session(f"{user_id}-other", "s1") is None


# --- open_session ---------------------------------------------------------------------


async def test_open_session_creates_a_missing_session_empty(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.open_session(user_id, " s1 ", recent=10)
    assert (session.id, session.user_id, session.messages) == ("s1", user_id, [])
    assert texts(await history.get_session(user_id, "s1")) == []


async def test_open_session_without_id_creates_a_new_one(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.open_session(user_id, None, recent=10)
    assert uuid.UUID(session.id)
    assert await history.get_session(user_id, session.id) is not None


async def test_open_session_returns_only_the_last_messages_in_order(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, [text_message(f"m{i}") for i in range(12)])
    assert texts(await history.open_session(user_id, "s1", recent=5)) == [
        f"m{i}" for i in range(7, 12)
    ]
    assert len(texts(await history.open_session(user_id, "s1", recent=50))) == 12
    assert len(texts(await history.open_session(user_id, "s1", recent=13))) == 12
    assert texts(await history.open_session(user_id, "s1", recent=0)) == []
    assert len(texts(await history.get_session(user_id, "s1"))) == 12


async def test_open_session_returns_the_last_messages_after_an_append_was_repeated(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, numbered(0, 3))
    # A retried append: its messages are in the session already, nothing is stored again.
    await history.append_message(session, numbered(0, 3, " again"))
    await history.append_message(session, numbered(1, 2, " again"))
    assert texts(await history.open_session(user_id, "s1", recent=2)) == ["m1", "m2"]
    assert texts(await history.open_session(user_id, "s1", recent=3)) == ["m0", "m1", "m2"]
    await history.append_message(session, numbered(3, 1))
    assert texts(await history.open_session(user_id, "s1", recent=2)) == ["m2", "m3"]


async def test_open_session_returns_a_copy(history: SessionHistoryService, user_id: str) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, text_message("original"))
    opened = await history.open_session(user_id, "s1", recent=1)
    message = opened.messages[0]
    assert isinstance(message, Message)
    message.content = [TextContent(text="changed")]
    await history.append_message(opened, text_message("next"))
    assert texts(await history.get_session(user_id, "s1")) == ["original", "next"]


async def test_open_session_of_another_user_does_not_see_the_history(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, text_message("private"))
    assert texts(await history.open_session(f"{user_id}-other", "s1", recent=10)) == []


@pytest.mark.parametrize("recent", [-1, 1.5, "3", True, None])
async def test_open_session_rejects_a_bad_window(
    history: SessionHistoryService, user_id: str, recent: object
) -> None:
    with pytest.raises(InvalidInputError):
        await history.open_session(user_id, "s1", recent=recent)  # type: ignore[arg-type]


# --- delete_session -------------------------------------------------------------------


async def test_delete_session_removes_it(history: SessionHistoryService, user_id: str) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, text_message("hello"))
    await history.delete_session(user_id, "s1")
    assert await history.get_session(user_id, "s1") is None
    assert await history.list_sessions(user_id) == []


async def test_delete_missing_session_is_not_an_error(
    history: SessionHistoryService, user_id: str
) -> None:
    await history.delete_session(user_id, "non_existent_id")
    await history.delete_session(user_id, "   ")


async def test_delete_only_touches_the_named_session(
    history: SessionHistoryService, user_id: str
) -> None:
    await history.create_session(user_id, "keep")
    await history.create_session(user_id, "drop")
    await history.delete_session(user_id, "drop")
    assert [s.id for s in await history.list_sessions(user_id)] == ["keep"]


async def test_deleted_session_can_be_created_again_empty(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, text_message("old"))
    await history.delete_session(user_id, "s1")
    again = await history.create_session(user_id, "s1")
    assert again.messages == []


async def test_delete_by_another_user_does_not_delete(
    history: SessionHistoryService, user_id: str
) -> None:
    await history.create_session(user_id, "s1")
    await history.delete_session(f"{user_id}-other", "s1")
    assert await history.get_session(user_id, "s1") is not None


# --- list_sessions --------------------------------------------------------------------


async def test_list_sessions_lists_the_users_sessions_without_messages(
    history: SessionHistoryService, user_id: str
) -> None:
    first = await history.create_session(user_id, "s1")
    await history.append_message(first, text_message("hello"))
    await history.create_session(user_id, "s2")
    listed = await history.list_sessions(user_id)
    assert [s.id for s in listed] == ["s1", "s2"]
    assert all(s.messages == [] and s.user_id == user_id for s in listed)


async def test_list_sessions_of_unknown_user_is_empty(history: SessionHistoryService) -> None:
    assert await history.list_sessions(f"nobody-{uuid.uuid4().hex}") == []


async def test_list_sessions_matches_the_user_exactly(
    history: SessionHistoryService, user_id: str
) -> None:
    a, a_b, star = user_id, f"{user_id}:b", "*"
    await history.create_session(a, "of-a")
    await history.create_session(a_b, "of-a-b")
    await history.create_session(star, f"of-star-{user_id}")
    assert [s.id for s in await history.list_sessions(a)] == ["of-a"]
    assert [s.id for s in await history.list_sessions(a_b)] == ["of-a-b"]
    star_ids = [s.id for s in await history.list_sessions(star)]
    assert "of-a" not in star_ids and "of-a-b" not in star_ids
    assert f"of-star-{user_id}" in star_ids
    assert await history.get_session(a, "of-a-b") is None
    assert await history.get_session(a, f"of-star-{user_id}") is None


@pytest.mark.parametrize("tricky", ["a:*", "a]", "a?", "{a}", "a\\", "a b", "ü/ß", "a%2F"])
async def test_ids_with_special_characters_stay_separate(
    history: SessionHistoryService, user_id: str, tricky: str
) -> None:
    owner = f"{user_id}{tricky}"
    session_id = f"s{tricky}".replace("/", "|")  # a session id holds no "/", a user id may
    session = await history.create_session(owner, session_id)
    await history.append_message(session, text_message("mine"))
    assert texts(await history.get_session(owner, session_id)) == ["mine"]
    assert [s.id for s in await history.list_sessions(owner)] == [session_id]
    assert await history.list_sessions(user_id) == []


async def test_list_sessions_page_walks_every_session_once_in_order(
    history: SessionHistoryService, user_id: str
) -> None:
    created = [(await history.create_session(user_id, f"s{i}")).id for i in range(7)]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await history.list_sessions_page(user_id, limit=3, cursor=cursor)
        pages += 1
        assert len(page.items) <= 3
        seen.extend(s.id for s in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == created
    assert pages == 3


@pytest.mark.parametrize("limit", [0, -1, 1001, "10", 2.5])
async def test_list_sessions_page_rejects_bad_limits(
    history: SessionHistoryService, user_id: str, limit: object
) -> None:
    with pytest.raises(InvalidInputError):
        await history.list_sessions_page(user_id, limit=limit)  # type: ignore[arg-type]


async def test_list_sessions_page_rejects_a_forged_cursor(
    history: SessionHistoryService, user_id: str
) -> None:
    await history.create_session(user_id, "s1")
    deep = base64.urlsafe_b64encode(b"[" * 100_000).decode()  # past what json.loads follows
    for forged in ("not-a-cursor!", deep):
        with pytest.raises(InvalidInputError, match="cursor is not valid"):
            await history.list_sessions_page(user_id, cursor=forged)


async def test_list_sessions_page_cursors_tell_nothing_of_other_users_sessions(
    history: SessionHistoryService, user_id: str
) -> None:
    # A cursor holds a place among the user's own sessions: the cursors of a user whose
    # sessions were created between another's are those of one who created them alone.
    other, alone = f"{user_id}-other", f"{user_id}-alone"
    for i in range(4):
        await history.create_session(user_id, f"s{i}")
        for j in range(3):
            await history.create_session(other, f"o{i}-{j}")
    for i in range(4):
        await history.create_session(alone, f"s{i}")

    async def cursors(owner: str) -> list[str]:
        found: list[str] = []
        cursor: str | None = None
        while (page := await history.list_sessions_page(owner, limit=1, cursor=cursor)).next_cursor:
            cursor = page.next_cursor
            found.append(cursor)
        return found

    # Each cursor also names the user's listing (a digest of a random value of theirs),
    # which tells nothing either: apart from it, the cursors are the same.
    def places(cursors: list[str]) -> list[dict[str, Any]]:
        return [{k: v for k, v in decode_cursor(c).items() if k != "listing"} for c in cursors]

    assert len(await cursors(user_id)) == 3
    assert places(await cursors(user_id)) == places(await cursors(alone))


async def test_a_sessions_cursor_read_before_an_erase_passes_over_no_later_session(
    history: SessionHistoryService, user_id: str
) -> None:
    # The cursor held a creation order, a count the user's erase started again: the
    # sessions made after it got the orders of those erased, and a cursor read before
    # passed over the first of them (200, sessions that exist missing from the listing).
    makes: list[Callable[[str], Awaitable[Any]]] = [
        lambda sid: history.create_session(user_id, sid),
        lambda sid: history.append_message(Session(id=sid, user_id=user_id), text_message("hi")),
        lambda sid: history.open_session(user_id, sid, recent=1),
        lambda sid: history.set_session_summary(user_id, sid, "summary"),
    ]
    for make in makes:
        for i in range(3):
            await history.create_session(user_id, f"old{i}")
        cursor = (await history.list_sessions_page(user_id, limit=2)).next_cursor
        assert cursor is not None
        await history.delete_user_sessions(user_id)
        # Refused with nothing to list, and once sessions were made again.
        with pytest.raises(InvalidInputError, match="cursor is not valid"):
            await history.list_sessions_page(user_id, cursor=cursor)
        for i in range(3):
            await make(f"new{i}")
        with pytest.raises(InvalidInputError, match="erased or expired"):
            await history.list_sessions_page(user_id, cursor=cursor)
        assert [s.id for s in await history.list_sessions(user_id)] == ["new0", "new1", "new2"]
        await history.delete_user_sessions(user_id)


async def test_a_sessions_cursor_outlives_the_sessions_deleted_one_by_one(
    history: SessionHistoryService, user_id: str
) -> None:
    # Deleting sessions, even the user's last, keeps their count: a cursor read before
    # reads on among the sessions made since.
    for i in range(3):
        await history.create_session(user_id, f"s{i}")
    cursor = (await history.list_sessions_page(user_id, limit=2)).next_cursor
    assert cursor is not None
    for i in range(3):
        await history.delete_session(user_id, f"s{i}")
    await history.create_session(user_id, "later")
    page = await history.list_sessions_page(user_id, cursor=cursor)
    assert [s.id for s in page.items] == ["later"]


# --- append_message -------------------------------------------------------------------


async def test_append_message_object(history: SessionHistoryService, user_id: str) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, text_message("Hello, world!"))
    assert len(session.messages) == 1
    assert texts(await history.get_session(user_id, "s1")) == ["Hello, world!"]


async def test_append_takes_a_session_not_its_id(history: SessionHistoryService) -> None:
    # A session id in its place failed deep in the service: "'str' object has no attribute".
    message = {"role": "assistant", "content": "x"}
    with pytest.raises(InvalidInputError, match=r"^session must be a Session, got str$"):
        await history.append_message("s1", message)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"^session must be a Session, got str$"):
        await history.append_new_messages("s1", [Message()], field="input")  # type: ignore[arg-type]


async def test_append_encodes_each_message_once(
    history: SessionHistoryService, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The JSON the append checks a message with is the JSON stored: no second encoding.
    encodings: list[str] = []
    encode = Message.model_dump_json

    def counted(message: Message, **options: Any) -> str:
        encodings.append(message.id)
        return encode(message, **options)

    session = await history.create_session(user_id, "s1")
    given = [text_message("one"), text_message("two", role="assistant")]
    monkeypatch.setattr(Message, "model_dump_json", counted)
    await history.append_message(session, given)
    monkeypatch.undo()
    assert sorted(encodings) == sorted(m.id for m in given)
    assert texts(await history.get_session(user_id, "s1")) == ["one", "two"]


async def test_append_dict_stores_a_validated_message(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(
        session, {"role": "user", "content": [{"type": "text", "text": "How are you?"}]}
    )
    stored = await history.get_session(user_id, "s1")
    assert stored is not None
    assert isinstance(stored.messages[0], Message)
    assert stored.messages[0].role == "user"
    assert isinstance(session.messages[0], Message)


async def test_append_mixed_list_keeps_order(history: SessionHistoryService, user_id: str) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, text_message("Hello"))
    await history.append_message(
        session,
        [
            {"role": "user", "content": [{"type": "text", "text": "How are you?"}]},
            text_message("I am fine, thank you.", role="assistant"),
        ],
    )
    assert len(session.messages) == 3
    assert texts(await history.get_session(user_id, "s1")) == [
        "Hello",
        "How are you?",
        "I am fine, thank you.",
    ]


async def test_append_skips_none_items(history: SessionHistoryService, user_id: str) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, [None, text_message("x"), None])  # type: ignore[list-item]
    assert texts(await history.get_session(user_id, "s1")) == ["x"]


async def test_append_invalid_dict_raises_and_stores_nothing(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    with pytest.raises(InvalidInputError) as raised:
        await history.append_message(
            session, [text_message("fine"), {"role": "robot", "content": "x"}]
        )
    assert "message[1]" in str(raised.value)
    assert raised.value.errors[0]["loc"][:2] == ["message[1]", "role"]
    assert texts(await history.get_session(user_id, "s1")) == []
    assert session.messages == []


def data_message(levels: int) -> dict[str, object]:
    """A message whose JSON nests ``levels`` deep (4 of them its own, then arrays)."""
    value: object = 1
    for _ in range(levels - 4):
        value = [value]
    return {"role": "user", "content": [{"type": "data", "data": {"v": value}}]}


async def test_a_message_nesting_deeper_than_a_hundred_levels_is_refused_and_nothing_stored(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, data_message(100))
    for levels in (101, 300, 5_000):  # 300: past pydantic's encoder; 5,000: its validator
        with pytest.raises(InvalidInputError, match=r"message\[1\] nests deeper than 100"):
            await history.append_message(session, [text_message("fine"), data_message(levels)])
    stored = await history.get_session(user_id, "s1")
    assert stored is not None and len(stored.messages) == 1
    (part,) = stored.messages[0].content or []
    assert part.model_dump()["data"] == data_message(100)["content"][0]["data"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"metadata": {"score": float("nan")}}, r"message\[1\]\.metadata\.score"),
        ({"usage": {"tokens": [1, float("inf")]}}, r"message\[1\]\.usage\.tokens\.1"),
        (
            {"content": [{"type": "data", "data": {"x": {"y": -float("inf")}}}]},
            r"message\[1\]\.content\.0\.data\.x\.y",
        ),
    ],
)
async def test_a_message_holding_nan_or_an_infinity_is_refused_and_nothing_stored(
    history: SessionHistoryService, user_id: str, fields: dict[str, Any], where: str
) -> None:
    """JSON has no NaN or infinity: stored, they would be read back as null."""
    session = await history.create_session(user_id, "s1")
    bad = {"role": "user", **fields}
    with pytest.raises(InvalidInputError, match=f"^{where} is not a number JSON can carry"):
        await history.append_message(session, [text_message("fine"), bad])
    stored = await history.get_session(user_id, "s1")
    assert stored is not None and stored.messages == []


@pytest.mark.parametrize(
    ("message_id", "why"), [("", "must not be empty"), ("m" * 513, "is longer than 512")]
)
async def test_a_message_id_empty_or_longer_than_512_characters_is_refused_and_nothing_stored(
    history: SessionHistoryService, user_id: str, message_id: str, why: str
) -> None:
    session = await history.create_session(user_id, "s1")
    bad = {"id": message_id, "role": "user", "content": "hi"}
    with pytest.raises(InvalidInputError, match=rf"^message\[1\]\.id {why}") as raised:
        await history.append_message(session, [text_message("fine"), bad])
    assert raised.value.errors[0]["loc"] == ["message[1].id"]
    await history.append_message(session, {"id": "m" * 512, "role": "user", "content": "kept"})
    stored = await history.get_session(user_id, "s1")
    assert stored is not None
    assert [m.id for m in stored.messages] == ["m" * 512]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("message_id", "why"),
    [
        ("a\x00b", "must not contain control characters"),
        ("\x1b[31mred", "must not contain control characters"),
        ("\x7f", "must not contain control characters"),
        ("\x85", "must not contain control characters"),
        (" ", "must not be blank"),
        ("\t\n", "must not be blank"),
    ],
)
async def test_a_message_id_holding_a_control_character_or_only_whitespace_is_refused(
    history: SessionHistoryService, user_id: str, message_id: str, why: str
) -> None:
    session = await history.create_session(user_id, "s1")
    bad = {"id": message_id, "role": "user", "content": "hi"}
    with pytest.raises(InvalidInputError, match=rf"^message\[1\]\.id {why}") as raised:
        await history.append_message(session, [text_message("fine"), bad])
    assert raised.value.errors[0]["loc"] == ["message[1].id"]
    kept = [" padded ", "tab\tand\nline"]
    await history.append_message(
        session, [{"id": i, "role": "user", "content": "kept"} for i in kept]
    )
    stored = await history.get_session(user_id, "s1")
    assert stored is not None
    assert [m.id for m in stored.messages] == kept  # type: ignore[union-attr]


async def test_a_message_stored_before_ids_were_held_to_more_stays_reachable_by_its_id(
    history: SessionHistoryService, user_id: str
) -> None:
    # Ids a new message may no longer have, stored as earlier versions took them.
    old = ["a\x00b", "\x1b[31mred", " "]
    await history._append_messages(
        user_id, "s1", [Message(id=i, role="user", content=[TextContent(text=i)]) for i in old]
    )
    stored = await history.get_session(user_id, "s1")
    assert stored is not None and [m.id for m in stored.messages] == old  # type: ignore[union-attr]
    assert list(await history.stored_messages(user_id, "s1", old)) == old
    assert await history.update_message_marks(user_id, "s1", "seen", None, old[:2]) == 2
    assert await history.message_marks(user_id, "s1") == {i: ["seen"] for i in old[:2]}
    assert await history.delete_messages(user_id, "s1", old[1:]) == 2
    assert texts(await history.get_session(user_id, "s1")) == ["a\x00b"]


async def test_marks_and_message_ids_that_are_no_valid_unicode_are_refused_naming_them(
    history: SessionHistoryService, user_id: str
) -> None:
    # In memory kept the mark, Redis raised UnicodeEncodeError, DynamoDB an outage (500).
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, {"id": "m1", "role": "user", "content": "hi"})
    calls = {
        "new_mark": history.update_message_marks(user_id, "s1", "\ud800", None, ["m1"]),
        "old_mark": history.update_message_marks(user_id, "s1", "x", "\ud800", ["m1"]),
        "message_ids": history.update_message_marks(user_id, "s1", "x", None, ["m1", "\ud800"]),
    }
    for field, call in calls.items():
        with pytest.raises(InvalidInputError, match=f"^{field}.* is not valid Unicode") as raised:
            await call
        assert raised.value.errors[0]["loc"][0] == field
    for lookup in (history.delete_messages, history.stored_messages):
        with pytest.raises(InvalidInputError, match=r"^message_ids\.1 is not valid Unicode"):
            await lookup(user_id, "s1", ["m1", "\ud800"])
    assert await history.message_marks(user_id, "s1") == {}
    assert texts(await history.get_session(user_id, "s1")) == ["hi"]


async def test_append_rejects_a_non_message(history: SessionHistoryService, user_id: str) -> None:
    session = await history.create_session(user_id, "s1")
    with pytest.raises(InvalidInputError):
        await history.append_message(session, 42)  # type: ignore[arg-type]


async def test_append_stores_a_copy(history: SessionHistoryService, user_id: str) -> None:
    session = await history.create_session(user_id, "s1")
    message = text_message("original")
    await history.append_message(session, message)
    message.content = [TextContent(text="changed later")]
    assert texts(await history.get_session(user_id, "s1")) == ["original"]


async def test_append_to_a_missing_session_creates_it(
    history: SessionHistoryService, user_id: str
) -> None:
    session = Session(id="never-created", user_id=user_id)
    await history.append_message(session, text_message("kept"))
    assert texts(await history.get_session(user_id, "never-created")) == ["kept"]
    assert [s.id for s in await history.list_sessions(user_id)] == ["never-created"]


async def test_an_id_given_twice_in_one_append_keeps_its_first_message(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(
        session,
        [
            {"id": "twice", "role": "user", "content": "first"},
            {"id": "twice", "role": "user", "content": "second"},
            {"id": "other", "role": "user", "content": "other"},
        ],
    )
    assert [m.get_text_content() for m in session.messages] == ["first", "other"]
    stored = await history.get_session(user_id, "s1")
    assert stored is not None
    assert [m.get_text_content() for m in stored.messages] == ["first", "other"]


def message_ids(session: Session | None) -> list[str]:
    assert session is not None
    return [m.id for m in session.messages if isinstance(m, Message)]


async def test_a_retried_append_adds_to_the_session_object_what_it_does_not_hold(
    history: SessionHistoryService, user_id: str
) -> None:
    # The object passed in got every message again, stored or not: ['m1', 'm1'] for a
    # history holding m1 once.
    session = await history.create_session(user_id, "s1")
    first = Message(id="m1", role="user", content="hello")
    await history.append_message(session, first)
    await history.append_message(session, first)
    assert message_ids(session) == ["m1"]
    await history.append_message(session, [first, Message(id="m2", role="assistant")])
    assert message_ids(session) == ["m1", "m2"]
    # An object read after the append (a retry of a request whose answer was lost).
    read = await history.get_session(user_id, "s1")
    assert read is not None
    await history.append_message(read, [*numbered(1, 2), *numbered(3, 1)])
    assert message_ids(read) == ["m1", "m2", "m3"]
    assert message_ids(await history.get_session(user_id, "s1")) == ["m1", "m2", "m3"]
    # A window of the last messages gets the stored message of an id it does not hold.
    window = await history.open_session(user_id, "s1", recent=1)
    await history.append_message(window, [first, *numbered(3, 2)])
    assert message_ids(window) == ["m3", "m1", "m4"]
    assert [m.get_text_content() for m in window.messages][1] == "hello"
    assert message_ids(await history.get_session(user_id, "s1")) == ["m1", "m2", "m3", "m4"]


async def test_stored_messages_are_those_of_the_ids_given_the_session_holds(
    history: SessionHistoryService, user_id: str
) -> None:
    assert await history.stored_messages(user_id, "s1", ["a"]) == {}
    session = await history.create_session(user_id, "s1")
    await history.append_message(
        session, [{"id": i, "role": "user", "content": f"text {i}"} for i in ("a", "b", "c")]
    )
    found = await history.stored_messages(user_id, "s1", ["c", "missing", "a"])
    assert {i: m.get_text_content() for i, m in found.items()} == {"c": "text c", "a": "text a"}
    assert await history.stored_messages("someone-else", "s1", ["a"]) == {}


async def test_messages_whose_given_id_names_one_saying_else_are_refused(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, {"id": "a", "role": "user", "content": "first"})

    def given(text: str, message_id: str = "a", role: str = "user") -> Message:
        return Message.model_validate({"id": message_id, "role": role, "content": text})

    for changed in ([given("other")], [given("first", role="assistant")]):
        with pytest.raises(MessageIdConflictError, match=r"^input\[0\]\.id names a message"):
            await history.refuse_changed_messages(user_id, "s1", changed, field="input")
    with pytest.raises(MessageIdConflictError, match=r"^input\[1\]\.id"):
        await history.refuse_changed_messages(
            user_id, "s1", [given("x", "b"), given("y", "b")], field="input"
        )
    # The very same message again (a retry), new ids, and made ids pass.
    made = Message(role="user", content="other")
    await history.refuse_changed_messages(
        user_id, "s1", [given("first"), given("new", "b"), made], field="input"
    )


def with_given_id(text: str, message_id: str) -> Message:
    """A message whose id its sender gave."""
    return Message.model_validate({"id": message_id, "role": "user", "content": text})


async def test_an_append_refused_for_an_id_stored_meanwhile_stores_none_of_its_messages(
    history: SessionHistoryService, user_id: str
) -> None:
    # The other message of the refused append was stored all the same: ['x', 'y', 'z'].
    await history.append_new_messages(
        Session(id="s1", user_id=user_id),
        [with_given_id("x", "x"), with_given_id("y", "y")],
        field="message",
    )
    # Checked before the other append stored x: the append itself finds x saying else.
    late = Session(id="s1", user_id=user_id)
    with pytest.raises(MessageIdConflictError, match=r"^message\[0\]\.id names a message another"):
        await history.append_new_messages(
            late,
            [with_given_id("other x", "x"), with_given_id("z", "z")],
            field="message",
            checked=True,
        )
    assert late.messages == []
    assert texts(await history.get_session(user_id, "s1")) == ["x", "y"]
    assert await history.stored_messages(user_id, "s1", ["z"]) == {}
    # Its retry with an id of its own stores both, after the others.
    await history.append_new_messages(
        late,
        [with_given_id("other x", "x2"), with_given_id("z", "z")],
        field="message",
        checked=True,
    )
    assert texts(late) == ["other x", "z"]
    assert texts(await history.get_session(user_id, "s1")) == ["x", "y", "other x", "z"]


async def test_appends_at_once_of_one_given_id_saying_else_store_one_of_them_whole(
    history: SessionHistoryService, user_id: str
) -> None:
    # The refused appends stored their other message all the same.
    sessions = [Session(id="s1", user_id=user_id) for _ in range(8)]
    answers = await asyncio.gather(
        *(
            history.append_new_messages(
                session,
                [with_given_id(f"x{i}", "x"), with_given_id(f"z{i}", f"z{i}")],
                field="message",
            )
            for i, session in enumerate(sessions)
        ),
        return_exceptions=True,
    )
    taken = [i for i, answer in enumerate(answers) if not isinstance(answer, BaseException)]
    assert len(taken) == 1, answers
    assert answers[taken[0]] == {"x", f"z{taken[0]}"}
    assert all(
        isinstance(answer, MessageIdConflictError)
        for i, answer in enumerate(answers)
        if i not in taken
    )
    assert texts(await history.get_session(user_id, "s1")) == [f"x{taken[0]}", f"z{taken[0]}"]


async def test_appends_at_once_of_the_same_messages_each_say_which_ones_they_stored(
    history: SessionHistoryService, user_id: str
) -> None:
    # What the runner adds to memory: the input its own append stored. Of appends sent at
    # once with the same messages (a retry racing its first try), one says it stored each.
    given = [with_given_id("x", "x"), with_given_id("y", "y")]
    answers = await asyncio.gather(
        *(
            history.append_new_messages(Session(id="s1", user_id=user_id), given, field="message")
            for _ in range(8)
        )
    )
    assert sorted(i for answer in answers for i in answer) == ["x", "y"]
    assert texts(await history.get_session(user_id, "s1")) == ["x", "y"]
    # Sent again, they are held: none stored.
    assert (
        await history.append_new_messages(Session(id="s1", user_id=user_id), given, field="message")
        == set()
    )


async def test_append_keeps_message_ids_and_roles(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    message = text_message("hi", role="assistant")
    await history.append_message(session, message)
    stored = await history.get_session(user_id, "s1")
    assert stored is not None
    assert stored.messages[0].id == message.id  # type: ignore[union-attr]
    assert stored.messages[0].role == "assistant"  # type: ignore[union-attr]


async def test_fifty_concurrent_appends_all_land_in_one_order(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await asyncio.gather(
        *(
            history.append_message(Session(id="s1", user_id=user_id), text_message(f"m{i}"))
            for i in range(50)
        )
    )
    first = texts(await history.get_session(user_id, "s1"))
    second = texts(await history.get_session(user_id, "s1"))
    assert sorted(first, key=str) == sorted((f"m{i}" for i in range(50)), key=str)
    assert first == second
    paged: list[str | None] = []
    cursor: str | None = None
    while True:
        page = await history.list_messages(user_id, session.id, limit=7, cursor=cursor)
        paged.extend(m.get_text_content() for m in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert paged == first


async def test_concurrent_batches_stay_contiguous(
    history: SessionHistoryService, user_id: str
) -> None:
    await history.create_session(user_id, "s1")
    await asyncio.gather(
        *(
            history.append_message(
                Session(id="s1", user_id=user_id),
                [text_message(f"q{i}"), text_message(f"a{i}", role="assistant")],
            )
            for i in range(20)
        )
    )
    stored = texts(await history.get_session(user_id, "s1"))
    assert len(stored) == 40
    for position in range(0, 40, 2):
        question, answer = stored[position], stored[position + 1]
        assert question is not None and answer is not None
        assert question.startswith("q") and answer == "a" + question[1:]


# --- list_messages (paginated read) ---------------------------------------------------


async def test_list_messages_pages_through_the_history(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, [text_message(f"m{i}") for i in range(25)])
    sizes: list[int] = []
    seen: list[str | None] = []
    cursor: str | None = None
    while True:
        page = await history.list_messages(user_id, "s1", limit=10, cursor=cursor)
        sizes.append(len(page.items))
        seen.extend(m.get_text_content() for m in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sizes == [10, 10, 5]
    assert seen == [f"m{i}" for i in range(25)]


async def test_list_messages_of_an_empty_session_is_one_empty_page(
    history: SessionHistoryService, user_id: str
) -> None:
    await history.create_session(user_id, "s1")
    page = await history.list_messages(user_id, "s1")
    assert page.items == [] and page.next_cursor is None


async def test_list_messages_of_a_missing_session_raises_not_found(
    history: SessionHistoryService, user_id: str
) -> None:
    with pytest.raises(SessionNotFoundError):
        await history.list_messages(user_id, "missing")


async def test_list_messages_of_another_users_session_raises_not_found(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, text_message("secret"))
    with pytest.raises(SessionNotFoundError):
        await history.list_messages(f"{user_id}:b", "s1")


@pytest.mark.parametrize("limit", [0, -5, 1001, None])
async def test_list_messages_rejects_bad_limits(
    history: SessionHistoryService, user_id: str, limit: object
) -> None:
    await history.create_session(user_id, "s1")
    with pytest.raises(InvalidInputError):
        await history.list_messages(user_id, "s1", limit=limit)  # type: ignore[arg-type]


async def test_list_messages_rejects_a_garbage_cursor(
    history: SessionHistoryService, user_id: str
) -> None:
    await history.create_session(user_id, "s1")
    with pytest.raises(InvalidInputError):
        await history.list_messages(user_id, "s1", cursor="%%%")
    # The same on every backend whether the session exists or not (in memory, a missing
    # session's read was None, a 404, where the others refused the cursor).
    with pytest.raises(InvalidInputError):
        await history.list_messages(user_id, "missing", cursor="%%%")


async def test_a_messages_cursor_pages_only_its_own_session(
    history: SessionHistoryService, user_id: str
) -> None:
    # A messages cursor held only a position: used on another session, or on a session
    # deleted and created again under the same id, it read on from there (200, messages
    # skipped); on DynamoDB a sessions-list cursor was taken as a messages cursor, and back.
    for session_id in ("a", "b"):
        session = await history.create_session(user_id, session_id)
        await history.append_message(session, numbered(0, 6))
    cursor = (await history.list_messages(user_id, "a", limit=4)).next_cursor
    assert cursor is not None
    others = await history.create_session(f"{user_id}:other", "a")
    await history.append_message(others, numbered(0, 6))
    for owner, session_id in ((user_id, "b"), (f"{user_id}:other", "a")):
        with pytest.raises(InvalidInputError, match="another session"):
            await history.list_messages(owner, session_id, cursor=cursor)
    await history.delete_session(user_id, "a")
    again = await history.create_session(user_id, "a")
    await history.append_message(again, numbered(0, 6))
    with pytest.raises(InvalidInputError, match="an earlier session of this id"):
        await history.list_messages(user_id, "a", cursor=cursor)
    sessions_cursor = (await history.list_sessions_page(user_id, limit=1)).next_cursor
    assert sessions_cursor is not None
    with pytest.raises(InvalidInputError, match="cursor is not valid"):
        await history.list_messages(user_id, "a", cursor=sessions_cursor)
    messages_cursor = (await history.list_messages(user_id, "a", limit=1)).next_cursor
    with pytest.raises(InvalidInputError, match="cursor is not valid"):
        await history.list_sessions_page(user_id, cursor=messages_cursor)
    assert ids_of(await history.list_messages(user_id, "a", cursor=messages_cursor)) == [
        f"m{i}" for i in range(1, 6)
    ]


async def test_a_messages_cursor_of_an_erased_session_pages_no_later_one_of_its_id(
    history: SessionHistoryService, user_id: str
) -> None:
    # In memory and on Redis the cursor named its session by its creation order, a count
    # the user's erase started again: the first session made after it got the order of
    # the erased one, and an old cursor paged it (200, its first messages skipped).
    cursor = None
    for _ in range(2):
        session = await history.create_session(user_id, "a")
        await history.append_message(session, numbered(0, 6))
        if cursor is not None:
            with pytest.raises(InvalidInputError, match="an earlier session of this id"):
                await history.list_messages(user_id, "a", cursor=cursor)
        cursor = (await history.list_messages(user_id, "a", limit=3)).next_cursor
        assert cursor is not None
        assert ids_of(await history.list_messages(user_id, "a", cursor=cursor)) == [
            "m3",
            "m4",
            "m5",
        ]
        await history.delete_user_sessions(user_id)
    # Made again otherwise: by an append alone (as a turn does), an open, a summary.
    for make in (
        lambda: history.append_message(Session(id="a", user_id=user_id), numbered(0, 6)),
        lambda: history.open_session(user_id, "a", recent=1),
        lambda: history.set_session_summary(user_id, "a", "summary"),
    ):
        await make()
        await history.append_message(Session(id="a", user_id=user_id), numbered(0, 6))
        with pytest.raises(InvalidInputError, match="an earlier session of this id"):
            await history.list_messages(user_id, "a", cursor=cursor)
        await history.delete_user_sessions(user_id)


# --- max_messages_per_session ---------------------------------------------------------


@pytest.fixture
async def kept_to_three(
    session_history_factory: Callable[..., SessionHistoryService],
) -> AsyncIterator[SessionHistoryService]:
    """A session history that keeps the newest three messages of each session."""
    async with session_history_factory(max_messages_per_session=3) as service:
        yield service


def numbered(first: int, count: int, text: str = "") -> list[Message]:
    """Messages with the ids ``m<first>``..., and those texts followed by ``text``."""
    return [
        Message(id=f"m{i}", role="user", content=f"m{i}{text}") for i in range(first, first + count)
    ]


async def test_a_session_kept_to_n_messages_keeps_the_newest_n(
    kept_to_three: SessionHistoryService, user_id: str
) -> None:
    session = await kept_to_three.create_session(user_id, "s1")
    await kept_to_three.append_message(session, numbered(0, 5))
    assert texts(await kept_to_three.get_session(user_id, "s1")) == ["m2", "m3", "m4"]
    await kept_to_three.append_message(session, numbered(5, 1))
    assert texts(await kept_to_three.get_session(user_id, "s1")) == ["m3", "m4", "m5"]
    opened = await kept_to_three.open_session(user_id, "s1", recent=2)
    assert texts(opened) == ["m4", "m5"]
    page = await kept_to_three.list_messages(user_id, "s1", limit=2)
    assert [m.get_text_content() for m in page.items] == ["m3", "m4"]
    assert page.next_cursor is not None
    rest = await kept_to_three.list_messages(user_id, "s1", cursor=page.next_cursor)
    assert [m.get_text_content() for m in rest.items] == ["m5"]
    assert rest.next_cursor is None


async def test_a_cursor_past_trimmed_messages_reads_on_from_the_oldest_kept(
    kept_to_three: SessionHistoryService, user_id: str
) -> None:
    session = await kept_to_three.create_session(user_id, "s1")
    await kept_to_three.append_message(session, numbered(0, 2))
    page = await kept_to_three.list_messages(user_id, "s1", limit=1)
    assert [m.get_text_content() for m in page.items] == ["m0"]
    assert page.next_cursor is not None
    await kept_to_three.append_message(session, numbered(2, 4))
    rest = await kept_to_three.list_messages(user_id, "s1", cursor=page.next_cursor)
    assert [m.get_text_content() for m in rest.items] == ["m3", "m4", "m5"]
    assert rest.next_cursor is None


async def test_a_message_appended_again_is_stored_again_only_once_trimmed(
    kept_to_three: SessionHistoryService, user_id: str
) -> None:
    session = await kept_to_three.create_session(user_id, "s1")
    await kept_to_three.append_message(session, numbered(0, 5))
    again = Session(id="s1", user_id=user_id)
    # m4 is kept: its stored message comes back; m0 was trimmed: it is appended anew.
    await kept_to_three.append_message(
        again, [*numbered(4, 1, " again"), *numbered(0, 1, " again")]
    )
    assert texts(again) == ["m4", "m0 again"]
    assert texts(await kept_to_three.get_session(user_id, "s1")) == ["m3", "m4", "m0 again"]


async def test_an_append_repeated_while_its_messages_are_kept_changes_nothing_stored(
    kept_to_three: SessionHistoryService, user_id: str
) -> None:
    session = await kept_to_three.create_session(user_id, "s1")
    await kept_to_three.append_message(session, numbered(0, 2))
    again = Session(id="s1", user_id=user_id)
    await kept_to_three.append_message(again, numbered(0, 2, " again"))
    assert texts(again) == ["m0", "m1"]
    assert texts(await kept_to_three.get_session(user_id, "s1")) == ["m0", "m1"]
    assert texts(await kept_to_three.open_session(user_id, "s1", recent=3)) == ["m0", "m1"]
    await kept_to_three.append_message(session, numbered(2, 2))
    assert texts(await kept_to_three.get_session(user_id, "s1")) == ["m1", "m2", "m3"]


async def test_concurrent_repeats_of_an_append_keep_its_messages_once(
    session_history_factory: Callable[..., SessionHistoryService], user_id: str
) -> None:
    # Retries arriving together: each repeat leaves unused sequence numbers behind on
    # DynamoDB, which a trim counted among the newest N before they were recorded.
    async with session_history_factory(max_messages_per_session=4) as kept_to_four:
        sessions = [Session(id="s1", user_id=user_id) for _ in range(8)]
        await asyncio.gather(
            *(kept_to_four.append_message(session, numbered(0, 3)) for session in sessions)
        )
        assert all(texts(session) == ["m0", "m1", "m2"] for session in sessions)
        assert texts(await kept_to_four.get_session(user_id, "s1")) == ["m0", "m1", "m2"]
        assert texts(await kept_to_four.open_session(user_id, "s1", recent=4)) == [
            "m0",
            "m1",
            "m2",
        ]
        await asyncio.gather(
            *(
                kept_to_four.append_message(
                    Session(id="s1", user_id=user_id), [*numbered(2, 1), *numbered(i, 1)]
                )
                for i in range(3, 9)
            )
        )
        kept = texts(await kept_to_four.get_session(user_id, "s1"))
        assert len(kept) == len(set(kept)) == 4
        assert texts(await kept_to_four.open_session(user_id, "s1", recent=10)) == kept


# --- ids, lifecycle -------------------------------------------------------------------


@pytest.mark.parametrize("bad_user", ["", "   ", None, 7])
async def test_blank_or_non_string_user_id_is_rejected(
    history: SessionHistoryService, bad_user: object
) -> None:
    with pytest.raises(InvalidInputError):
        await history.create_session(bad_user)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        await history.list_sessions(bad_user)  # type: ignore[arg-type]


async def test_overlong_session_id_is_rejected(
    history: SessionHistoryService, user_id: str
) -> None:
    with pytest.raises(InvalidInputError):
        await history.create_session(user_id, "x" * 513)


async def test_calls_before_start_raise_a_clear_runtime_error(
    session_history_factory: Callable[[], SessionHistoryService], user_id: str
) -> None:
    service = session_history_factory()
    calls = [
        service.create_session(user_id, "s1"),
        service.get_session(user_id, "s1"),
        service.delete_session(user_id, "s1"),
        service.list_sessions(user_id),
        service.append_message(Session(id="s1", user_id=user_id), text_message("x")),
        service.list_messages(user_id, "s1"),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="not started") as raised:
            await call
        assert isinstance(raised.value, ServiceNotStartedError)


async def test_calls_after_stop_raise_and_health_turns_false(
    session_history_factory: Callable[[], SessionHistoryService], user_id: str
) -> None:
    service = session_history_factory()
    await service.start()
    assert await service.health() is True
    await service.stop()
    assert await service.health() is False
    with pytest.raises(ServiceNotStartedError):
        await service.get_session(user_id, "s1")


async def test_async_with_starts_and_stops(
    session_history_factory: Callable[[], SessionHistoryService], user_id: str
) -> None:
    service = session_history_factory()
    async with service as started:
        assert started is service
        assert await service.health() is True
        await service.create_session(user_id, "s1")
    assert await service.health() is False


async def test_data_survives_a_new_service_object_on_the_same_store(
    session_history_factory: Callable[[], SessionHistoryService], user_id: str
) -> None:
    async with session_history_factory() as first:
        session = await first.create_session(user_id, "s1")
        await first.append_message(session, text_message("persisted"))
    async with session_history_factory() as second:
        assert texts(await second.get_session(user_id, "s1")) == ["persisted"]


# --- delete_messages and marks (AgentScope's memory API on the stored history) ----------


async def test_delete_messages_removes_those_ids_and_counts_them(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    a, b, c = text_message("a"), text_message("b"), text_message("c")
    await history.append_message(session, [a, b, c])
    assert await history.delete_messages(user_id, "s1", [b.id, "not-there"]) == 1
    assert texts(await history.get_session(user_id, "s1")) == ["a", "c"]
    page = await history.list_messages(user_id, "s1")
    assert [m.id for m in page.items] == [a.id, c.id]
    assert await history.delete_messages(user_id, "s1", [b.id]) == 0
    # Deleted, its id may be appended again: it goes at the end.
    await history.append_message(session, b)
    assert texts(await history.get_session(user_id, "s1")) == ["a", "c", "b"]


async def test_delete_messages_of_a_missing_session_deletes_nothing(
    history: SessionHistoryService, user_id: str
) -> None:
    assert await history.delete_messages(user_id, "missing", ["m1"]) == 0
    assert await history.get_session(user_id, "missing") is None


@pytest.mark.parametrize("bad", ["m1", [1], None])
async def test_delete_messages_refuses_ids_that_are_no_list_of_strings(
    history: SessionHistoryService, user_id: str, bad: Any
) -> None:
    with pytest.raises(InvalidInputError, match="message_ids"):
        await history.delete_messages(user_id, "s1", bad)


async def test_deletes_and_appends_at_once_lose_no_message(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    old = [text_message(f"old {i}") for i in range(10)]
    await history.append_message(session, old)
    new = [text_message(f"new {i}") for i in range(10)]
    gone = old[::2]
    results = await asyncio.gather(
        *(history.delete_messages(user_id, "s1", [m.id]) for m in gone),
        *(history.append_message(Session(id="s1", user_id=user_id), m) for m in new),
    )
    assert results[: len(gone)] == [1] * len(gone)
    stored = texts(await history.get_session(user_id, "s1"))
    assert stored[:5] == [m.get_text_content() for m in old[1::2]]
    assert sorted(stored[5:]) == sorted(m.get_text_content() for m in new)


async def test_a_session_kept_to_n_messages_counts_a_deleted_one_for_none(
    session_history_factory: Callable[..., SessionHistoryService], user_id: str
) -> None:
    async with session_history_factory(max_messages_per_session=3) as service:
        session = await service.create_session(user_id, "s1")
        a, b, c, d = (text_message(t) for t in "abcd")
        await service.append_message(session, [a, b, c])
        assert await service.delete_messages(user_id, "s1", [b.id]) == 1
        await service.append_message(session, d)
        assert texts(await service.get_session(user_id, "s1")) == ["a", "c", "d"]


def ids_of(page: Page[Message]) -> list[str]:
    return [m.id for m in page.items]


async def test_a_cursor_reads_on_through_deleted_messages_skipping_none(
    history: SessionHistoryService, user_id: str
) -> None:
    # In memory and on Redis a cursor held a place in the list, which a delete shifted: the
    # next page passed over as many messages as were deleted before it.
    session = await history.create_session(user_id, "s1")
    await history.append_message(session, numbered(0, 8))
    page = await history.list_messages(user_id, "s1", limit=3)
    assert ids_of(page) == ["m0", "m1", "m2"] and page.next_cursor is not None
    # A message read already (as an AgentScope memory's delete does), the last one read
    # (the cursor's own) and one not read yet.
    assert await history.delete_messages(user_id, "s1", ["m0", "m2", "m4"]) == 3
    page = await history.list_messages(user_id, "s1", limit=2, cursor=page.next_cursor)
    assert ids_of(page) == ["m3", "m5"] and page.next_cursor is not None
    assert await history.delete_messages(user_id, "s1", ["m5"]) == 1
    await history.append_message(session, numbered(8, 1))
    rest = await history.list_messages(user_id, "s1", cursor=page.next_cursor)
    assert ids_of(rest) == ["m6", "m7", "m8"] and rest.next_cursor is None
    # A deleted message appended again goes at the end, past the cursors given so far.
    await history.append_message(session, numbered(0, 1))
    last = await history.list_messages(user_id, "s1", limit=2, cursor=page.next_cursor)
    assert ids_of(last) == ["m6", "m7"]
    assert last.next_cursor is not None
    final = await history.list_messages(user_id, "s1", cursor=last.next_cursor)
    assert ids_of(final) == ["m8", "m0"] and final.next_cursor is None


async def test_a_session_kept_to_n_messages_trims_and_pages_past_deleted_ones(
    kept_to_three: SessionHistoryService, user_id: str
) -> None:
    session = await kept_to_three.create_session(user_id, "s1")
    await kept_to_three.append_message(session, numbered(0, 3))
    page = await kept_to_three.list_messages(user_id, "s1", limit=1)
    assert ids_of(page) == ["m0"]
    assert await kept_to_three.delete_messages(user_id, "s1", ["m1"]) == 1
    await kept_to_three.append_message(session, numbered(3, 2))
    assert texts(await kept_to_three.get_session(user_id, "s1")) == ["m2", "m3", "m4"]
    rest = await kept_to_three.list_messages(user_id, "s1", cursor=page.next_cursor)
    assert ids_of(rest) == ["m2", "m3", "m4"] and rest.next_cursor is None
    assert list(await kept_to_three.stored_messages(user_id, "s1", ["m0", "m1", "m3"])) == ["m3"]
    assert await kept_to_three.delete_messages(user_id, "s1", ["m3"]) == 1
    await kept_to_three.append_message(session, numbered(5, 2))
    assert texts(await kept_to_three.open_session(user_id, "s1", recent=3)) == ["m4", "m5", "m6"]
    page = await kept_to_three.list_messages(user_id, "s1", limit=2)
    assert ids_of(page) == ["m4", "m5"]
    rest = await kept_to_three.list_messages(user_id, "s1", cursor=page.next_cursor)
    assert ids_of(rest) == ["m6"] and rest.next_cursor is None
    # A kept message appended again is the stored one, found at its place.
    again = Session(id="s1", user_id=user_id)
    await kept_to_three.append_message(again, numbered(5, 1, " again"))
    assert texts(again) == ["m5"]
    assert texts(await kept_to_three.get_session(user_id, "s1")) == ["m4", "m5", "m6"]


async def test_update_message_marks_adds_changes_and_removes_marks_as_agentscope(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    a, b, c = text_message("a"), text_message("b"), text_message("c")
    await history.append_message(session, [a, b, c])
    assert await history.message_marks(user_id, "s1") == {}
    assert await history.update_message_marks(user_id, "s1", "compressed", None, [a.id, b.id]) == 2
    assert await history.message_marks(user_id, "s1") == {
        a.id: ["compressed"],
        b.id: ["compressed"],
    }
    # An old mark: only the messages holding it, which lose it for the new one.
    assert await history.update_message_marks(user_id, "s1", "summed", "compressed") == 2
    assert await history.message_marks(user_id, "s1") == {a.id: ["summed"], b.id: ["summed"]}
    # No new mark: the old one is removed.
    assert await history.update_message_marks(user_id, "s1", None, "summed", [a.id]) == 1
    # No old mark and no ids: the new mark goes on every message.
    assert await history.update_message_marks(user_id, "s1", "seen") == 3
    assert await history.message_marks(user_id, "s1") == {
        a.id: ["seen"],
        b.id: ["summed", "seen"],
        c.id: ["seen"],
    }
    assert await history.update_message_marks(user_id, "s1", "x", None, ["not-there"]) == 0
    assert await history.update_message_marks(user_id, "missing", "x") == 0


async def test_marks_go_with_their_message_and_their_session(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    a, b = text_message("a"), text_message("b")
    await history.append_message(session, [a, b])
    await history.update_message_marks(user_id, "s1", "compressed")
    await history.delete_messages(user_id, "s1", [a.id])
    assert await history.message_marks(user_id, "s1") == {b.id: ["compressed"]}
    await history.delete_session(user_id, "s1")
    await history.append_message(Session(id="s1", user_id=user_id), b)
    assert await history.message_marks(user_id, "s1") == {}


async def test_marks_updated_at_once_are_all_kept(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    a = text_message("a")
    await history.append_message(session, a)
    marks = [f"mark-{i}" for i in range(8)]
    await asyncio.gather(
        *(history.update_message_marks(user_id, "s1", m, None, [a.id]) for m in marks)
    )
    assert sorted((await history.message_marks(user_id, "s1"))[a.id]) == marks


async def test_a_session_keeps_one_summary_until_replaced_or_deleted(
    history: SessionHistoryService, user_id: str
) -> None:
    assert await history.session_summary(user_id, "s1") == ""
    await history.set_session_summary(user_id, "s1", "they talked of tea")
    assert await history.session_summary(user_id, "s1") == "they talked of tea"
    # Setting it creates the session, whose history stays as it was.
    assert texts(await history.get_session(user_id, "s1")) == []
    await history.append_message(Session(id="s1", user_id=user_id), text_message("a"))
    await history.set_session_summary(user_id, "s1", "and of coffee")
    assert await history.session_summary(user_id, "s1") == "and of coffee"
    assert texts(await history.get_session(user_id, "s1")) == ["a"]
    await history.set_session_summary(user_id, "s1", "")
    assert await history.session_summary(user_id, "s1") == ""
    await history.set_session_summary(user_id, "s1", "again")
    await history.delete_session(user_id, "s1")
    assert await history.session_summary(user_id, "s1") == ""


# A summary, as a message, may be larger than a DynamoDB item (400 KB): about 600 KB of
# UTF-8, whose multi-byte characters make sure it is split between characters, never inside.
LARGE_SUMMARY = ("they talked of tea ✓ 𝄞 " * 25_000)[:500_000]


async def test_a_summary_larger_than_a_dynamodb_item_is_kept_whole_apart_from_the_history(
    history: SessionHistoryService, user_id: str
) -> None:
    session = await history.create_session(user_id, "s1")
    a, b = text_message("a"), text_message("b")
    await history.append_message(session, [a, b])
    await history.set_session_summary(user_id, "s1", LARGE_SUMMARY)
    assert await history.session_summary(user_id, "s1") == LARGE_SUMMARY
    # No read or change of the history takes any of it for a message.
    assert texts(await history.get_session(user_id, "s1")) == ["a", "b"]
    assert texts(await history.open_session(user_id, "s1", recent=1)) == ["b"]
    assert texts(await history.open_session(user_id, "s1", recent=5)) == ["a", "b"]
    page = await history.list_messages(user_id, "s1", limit=1)
    rest = await history.list_messages(user_id, "s1", cursor=page.next_cursor)
    assert [m.get_text_content() for m in [*page.items, *rest.items]] == ["a", "b"]
    assert rest.next_cursor is None
    assert [s.id for s in await history.list_sessions(user_id)] == ["s1"]
    assert await history.update_message_marks(user_id, "s1", "seen") == 2
    assert await history.message_marks(user_id, "s1") == {a.id: ["seen"], b.id: ["seen"]}
    assert await history.delete_messages(user_id, "s1", [a.id]) == 1
    assert texts(await history.get_session(user_id, "s1")) == ["b"]
    assert await history.session_summary(user_id, "s1") == LARGE_SUMMARY
    # Replaced by a larger one, a smaller one, or removed, it is the last one set.
    await history.set_session_summary(user_id, "s1", LARGE_SUMMARY * 2)
    assert await history.session_summary(user_id, "s1") == LARGE_SUMMARY * 2
    await history.set_session_summary(user_id, "s1", "short")
    assert await history.session_summary(user_id, "s1") == "short"
    await history.set_session_summary(user_id, "s1", LARGE_SUMMARY)
    await history.set_session_summary(user_id, "s1", "")
    assert await history.session_summary(user_id, "s1") == ""
    # It goes with its session: the session made again has none.
    await history.set_session_summary(user_id, "s1", LARGE_SUMMARY)
    await history.delete_session(user_id, "s1")
    assert await history.session_summary(user_id, "s1") == ""
    assert (await history.create_session(user_id, "s1")).messages == []
    assert await history.session_summary(user_id, "s1") == ""


async def test_a_large_summary_set_on_a_missing_session_creates_it(
    history: SessionHistoryService, user_id: str
) -> None:
    await history.set_session_summary(user_id, "s1", LARGE_SUMMARY)
    assert [s.id for s in await history.list_sessions(user_id)] == ["s1"]
    assert texts(await history.get_session(user_id, "s1")) == []
    assert await history.session_summary(user_id, "s1") == LARGE_SUMMARY


async def test_trimming_a_session_kept_to_n_messages_keeps_its_summary(
    kept_to_three: SessionHistoryService, user_id: str
) -> None:
    await kept_to_three.set_session_summary(user_id, "s1", LARGE_SUMMARY)
    session = await kept_to_three.create_session(user_id, "s1")
    for first in range(0, 8, 2):
        await kept_to_three.append_message(session, numbered(first, 2))
    assert texts(await kept_to_three.get_session(user_id, "s1")) == ["m5", "m6", "m7"]
    assert texts(await kept_to_three.open_session(user_id, "s1", recent=2)) == ["m6", "m7"]
    assert await kept_to_three.session_summary(user_id, "s1") == LARGE_SUMMARY


async def test_a_summary_that_is_no_text_is_refused(
    history: SessionHistoryService, user_id: str
) -> None:
    with pytest.raises(InvalidInputError, match="summary"):
        await history.set_session_summary(user_id, "s1", None)  # type: ignore[arg-type]
