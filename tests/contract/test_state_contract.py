"""CONTRACT §1 and §4: agent state, on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agentscope_serverless.errors import ConflictError, InvalidInputError, ServiceNotStartedError
from agentscope_serverless.services._once import seed_writes
from agentscope_serverless.services.agent_state import StateService
from agentscope_serverless.services.agent_state.base import MAX_ROUND_ID


async def test_first_save_is_round_one_then_two(state: StateService, user_id: str) -> None:
    assert await state.save_state(user_id, {"step": 1}) == 1
    assert await state.save_state(user_id, {"step": 2}) == 2


async def test_session_defaults_to_default(state: StateService, user_id: str) -> None:
    await state.save_state(user_id, {"v": 1})
    assert await state.export_state(user_id, session_id="default") == {"v": 1}
    await state.save_state(user_id, {"v": 2}, session_id="default")
    assert await state.export_state(user_id) == {"v": 2}


async def test_export_defaults_to_the_latest_round(state: StateService, user_id: str) -> None:
    await state.save_state(user_id, {"v": 1}, session_id="s1")
    await state.save_state(user_id, {"v": 2}, session_id="s1")
    assert await state.export_state(user_id, session_id="s1") == {"v": 2}
    assert await state.export_state(user_id, session_id="s1", round_id=1) == {"v": 1}


async def test_the_latest_state_comes_with_its_round(state: StateService, user_id: str) -> None:
    assert await state.export_latest_state(user_id, session_id="s1") is None
    await state.save_state(user_id, {"v": 1}, session_id="s1")
    await state.save_state(user_id, {"v": 7}, session_id="s1", round_id=7)
    await state.save_state(user_id, {"v": 3}, session_id="s1", round_id=3)
    assert await state.export_latest_state(user_id, session_id="s1") == (7, {"v": 7})
    big = {"text": "é" * 300_000}  # past DynamoDB's item size: stored across items
    assert await state.save_state(user_id, big, session_id="s1") == 8
    assert await state.export_latest_state(user_id, session_id="s1") == (8, big)
    await state.save_state(user_id, {"v": "default"})
    assert await state.export_latest_state(user_id) == (1, {"v": "default"})
    await state.delete_state(user_id, session_id="s1")
    assert await state.export_latest_state(user_id, session_id="s1") is None


async def test_export_missing_state_returns_none(state: StateService, user_id: str) -> None:
    assert await state.export_state(user_id) is None
    await state.save_state(user_id, {"v": 1})
    assert await state.export_state(user_id, round_id=99) is None
    assert await state.export_state(user_id, session_id="other") is None


async def test_explicit_round_overwrites(state: StateService, user_id: str) -> None:
    await state.save_state(user_id, {"v": 1})
    assert await state.save_state(user_id, {"v": "new"}, round_id=1) == 1
    assert await state.export_state(user_id, round_id=1) == {"v": "new"}
    assert await state.list_rounds(user_id) == [1]


async def test_auto_round_follows_the_highest_round(state: StateService, user_id: str) -> None:
    assert await state.save_state(user_id, {"v": 10}, round_id=10) == 10
    assert await state.save_state(user_id, {"v": 11}) == 11
    assert await state.export_state(user_id) == {"v": 11}


async def test_no_round_is_allocated_past_the_largest_round_id(
    state: StateService, user_id: str
) -> None:
    """Past 2**53 - 1 a round cannot be exact in every store (on Redis, 2**53 + 1 would
    be the score of 2**53): a save that would allocate it is refused and stores nothing."""
    assert await state.save_state(user_id, {"v": "last"}, round_id=MAX_ROUND_ID) == MAX_ROUND_ID
    for _ in range(2):
        with pytest.raises(ConflictError, match="give round_id"):
            await state.save_state(user_id, {"v": "next"})
    assert await state.list_rounds(user_id) == [MAX_ROUND_ID]
    assert await state.export_state(user_id) == {"v": "last"}
    assert await state.save_state(user_id, {"v": 1}, round_id=1) == 1
    assert await state.export_state(user_id, round_id=MAX_ROUND_ID) == {"v": "last"}


async def test_state_is_copied_in(state: StateService, user_id: str) -> None:
    original = {"nested": {"items": [1, 2]}}
    await state.save_state(user_id, original)
    original["nested"]["items"].append(3)
    assert await state.export_state(user_id) == {"nested": {"items": [1, 2]}}


async def test_state_is_copied_out(state: StateService, user_id: str) -> None:
    await state.save_state(user_id, {"nested": {"items": [1, 2]}})
    exported = await state.export_state(user_id)
    assert exported is not None
    exported["nested"]["items"].append(3)
    exported["new"] = True
    assert await state.export_state(user_id) == {"nested": {"items": [1, 2]}}


async def test_state_round_trips_json_types(state: StateService, user_id: str) -> None:
    value = {
        "text": "héllo ✓",
        "int": 2**53,
        "float": 0.1,
        "bool": False,
        "none": None,
        "list": [1, "two", {"three": 3}],
        "empty": {},
    }
    await state.save_state(user_id, value)
    assert await state.export_state(user_id) == value


async def test_twenty_concurrent_saves_get_distinct_rounds(
    state: StateService, user_id: str
) -> None:
    rounds = await asyncio.gather(
        *(state.save_state(user_id, {"writer": i}, session_id="s1") for i in range(20))
    )
    assert sorted(rounds) == list(range(1, 21))
    for writer, round_id in enumerate(rounds):
        assert await state.export_state(user_id, session_id="s1", round_id=round_id) == {
            "writer": writer
        }
    assert await state.list_rounds(user_id, session_id="s1") == list(range(1, 21))


async def test_list_rounds_is_ascending(state: StateService, user_id: str) -> None:
    await state.save_state(user_id, {}, round_id=5)
    await state.save_state(user_id, {}, round_id=2)
    await state.save_state(user_id, {})
    assert await state.list_rounds(user_id) == [2, 5, 6]
    assert await state.list_rounds(user_id, session_id="none") == []


async def test_delete_state_removes_every_round_of_the_session(
    state: StateService, user_id: str
) -> None:
    await state.save_state(user_id, {"v": 1}, session_id="s1")
    await state.save_state(user_id, {"v": 2}, session_id="s1")
    await state.save_state(user_id, {"v": 3}, session_id="s2")
    await state.delete_state(user_id, session_id="s1")
    assert await state.export_state(user_id, session_id="s1") is None
    assert await state.list_rounds(user_id, session_id="s1") == []
    assert await state.export_state(user_id, session_id="s2") == {"v": 3}
    assert await state.save_state(user_id, {"v": 4}, session_id="s1") == 1


async def test_delete_missing_state_is_not_an_error(state: StateService, user_id: str) -> None:
    await state.delete_state(user_id, session_id="never")


async def test_state_of_users_and_sessions_is_separate(state: StateService, user_id: str) -> None:
    a, a_b, star = user_id, f"{user_id}:b", "*"
    await state.save_state(a_b, {"owner": "a:b"}, session_id="s")
    await state.save_state(star, {"owner": "*"}, session_id=f"s-{user_id}")
    assert await state.export_state(a, session_id="s") is None
    assert await state.export_state(a, session_id=f"s-{user_id}") is None
    assert await state.save_state(a, {"owner": "a"}, session_id="s") == 1
    assert await state.export_state(a_b, session_id="s") == {"owner": "a:b"}


@pytest.mark.parametrize("bad", [["a list"], "text", None, 3])
async def test_state_must_be_a_dict(state: StateService, user_id: str, bad: object) -> None:
    with pytest.raises(InvalidInputError, match="state must be a dict"):
        await state.save_state(user_id, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [{"s": {1, 2}}, {"o": object()}, {"nan": float("nan")}])
async def test_state_must_be_json_serialisable(
    state: StateService, user_id: str, bad: dict[str, object]
) -> None:
    with pytest.raises(InvalidInputError, match="JSON"):
        await state.save_state(user_id, bad)
    assert await state.export_state(user_id) is None


async def test_state_holding_an_infinity_is_refused_naming_where(
    state: StateService, user_id: str
) -> None:
    with pytest.raises(InvalidInputError, match=r"^state\.a\.1 is not a number JSON can carry"):
        await state.save_state(user_id, {"a": [1, float("inf")]})
    assert await state.export_state(user_id) is None


async def test_state_with_two_keys_json_writes_as_one_is_refused_naming_them(
    state: StateService, user_id: str
) -> None:
    # Stored as {"1": "str"}: the value under 1 was dropped without a word.
    with pytest.raises(InvalidInputError, match=r"^state has the keys 1 and '1'") as refused:
        await state.save_state(user_id, {1: "int", "1": "str"})
    assert refused.value.errors == [{"loc": ["state", "1"], "msg": "a key given twice"}]
    with pytest.raises(InvalidInputError, match=r"^state\.a\.0 has the keys True and 'true'"):
        await state.save_state(user_id, {"a": [{True: 1, "true": 2}]})
    assert await state.export_state(user_id) is None
    # Keys that stay apart in JSON are taken, as JSON writes them.
    await state.save_state(user_id, {1: "one", 2: "two", None: "none"})
    assert await state.export_state(user_id) == {"1": "one", "2": "two", "null": "none"}


def nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


async def test_state_of_a_hundred_levels_round_trips_and_deeper_is_refused(
    state: StateService, user_id: str
) -> None:
    deepest = {"v": nested(99)}  # 100 levels: the most JSON kept by a store may nest
    await state.save_state(user_id, deepest)
    assert await state.export_state(user_id) == deepest
    for levels in (100, 5_000):  # 5,000: past what json.dumps follows
        with pytest.raises(InvalidInputError, match="state nests deeper than 100 levels"):
            await state.save_state(user_id, {"v": nested(levels)})
    assert await state.list_rounds(user_id) == [1]


@pytest.mark.parametrize("bad_round", [0, -1, "1", 1.5, True])
async def test_round_id_must_be_a_positive_int(
    state: StateService, user_id: str, bad_round: object
) -> None:
    with pytest.raises(InvalidInputError):
        await state.save_state(user_id, {}, round_id=bad_round)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        await state.export_state(user_id, round_id=bad_round)  # type: ignore[arg-type]


async def test_blank_user_is_rejected(state: StateService) -> None:
    with pytest.raises(InvalidInputError):
        await state.save_state(" ", {})


async def test_calls_before_start_raise_a_clear_runtime_error(
    state_factory: Callable[[], StateService], user_id: str
) -> None:
    service = state_factory()
    calls = [
        service.save_state(user_id, {}),
        service.export_state(user_id),
        service.export_latest_state(user_id),
        service.list_rounds(user_id),
        service.delete_state(user_id),
    ]
    for call in calls:
        with pytest.raises(ServiceNotStartedError, match="not started"):
            await call


async def test_health_follows_the_lifecycle(state_factory: Callable[[], StateService]) -> None:
    service = state_factory()
    async with service:
        assert await service.health() is True
    assert await service.health() is False


async def test_state_survives_a_new_service_object(
    state_factory: Callable[[], StateService], user_id: str
) -> None:
    async with state_factory() as first:
        await first.save_state(user_id, {"kept": True}, session_id="s1")
    async with state_factory() as second:
        assert await second.export_state(user_id, session_id="s1") == {"kept": True}


# --- saves retried under an Idempotency-Key ------------------------------------------------


async def keyed_save(
    state: StateService, seed: str, user_id: str, value: int, record_seed: str = "record"
) -> int:
    """A save made as a request with an Idempotency-Key makes it (in its own context), under
    the key's record of ``record_seed``."""

    async def run() -> int:
        seed_writes(seed, record_seed)
        return await state.save_state(user_id, {"v": value}, session_id="s1")

    return await asyncio.create_task(run())


async def test_a_keyed_save_run_again_stores_one_round(state: StateService, user_id: str) -> None:
    assert await keyed_save(state, f"{user_id}\0key-1", user_id, 1) == 1
    # The same request again (its first answer was lost): the same round, stored once.
    assert await keyed_save(state, f"{user_id}\0key-1", user_id, 1) == 1
    assert await state.list_rounds(user_id, session_id="s1") == [1]
    assert await keyed_save(state, f"{user_id}\0key-2", user_id, 2) == 2
    assert await state.save_state(user_id, {"v": 3}, session_id="s1") == 3  # without a key
    assert await state.list_rounds(user_id, session_id="s1") == [1, 2, 3]
    # Another user's same key is another write.
    other = f"{user_id}-other"
    assert await keyed_save(state, f"{other}\0key-1", other, 1) == 1
    # A deleted session forgets its keyed saves with its rounds.
    await state.delete_state(user_id, session_id="s1")
    assert await keyed_save(state, f"{user_id}\0key-1", user_id, 4) == 1
    assert await state.export_state(user_id, session_id="s1") == {"v": 4}
    assert await state.save_state(user_id, {"v": 5}, session_id="s1") == 2
    assert await state.export_state(user_id, session_id="s1", round_id=1) == {"v": 4}


async def test_a_keyed_save_after_the_state_was_deleted_takes_a_round_of_the_new_state(
    state: StateService, user_id: str
) -> None:
    # On DynamoDB the delete left the save's applied write id: run again, the save took its
    # round 2 back, the first round of the new state.
    assert await keyed_save(state, f"{user_id}\0key-1", user_id, 1) == 1
    assert await keyed_save(state, f"{user_id}\0key-2", user_id, 2) == 2
    await state.delete_state(user_id, session_id="s1")
    assert await keyed_save(state, f"{user_id}\0key-2", user_id, 3) == 1
    assert await state.list_rounds(user_id, session_id="s1") == [1]
    assert await state.save_state(user_id, {"v": 4}, session_id="s1") == 2


async def test_a_keyed_save_under_its_keys_record_made_anew_takes_the_next_round(
    state: StateService, user_id: str
) -> None:
    seed = f"{user_id}\0key-1"
    assert await keyed_save(state, seed, user_id, 1, record_seed="first") == 1
    assert await state.save_state(user_id, {"v": 2}, session_id="s1") == 2
    # The key expired, or was erased: the same request runs anew, and is the latest.
    assert await keyed_save(state, seed, user_id, 3, record_seed="second") == 3
    assert await state.export_latest_state(user_id, session_id="s1") == (3, {"v": 3})
    # Run again under the record it ran under, it lands where it did.
    assert await keyed_save(state, seed, user_id, 3, record_seed="second") == 3
    assert await state.list_rounds(user_id, session_id="s1") == [1, 2, 3]
