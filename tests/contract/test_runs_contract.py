"""The runs store's contract, on every backend: records, events in order, cancel marks, users."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.services.runs import RunRecord, RunsService
from agentscope_serverless.services.runs.base import (
    FIRST_WRITE_DELAY,
    LOST_AFTER_SECONDS,
    RUN_LOST,
    RunBurst,
)
from agentscope_serverless.tasks import TaskDefinition, run_task
from tests.contract.conftest import RUNS_TTL_SECONDS, RunsAging, RunsLeftovers


def _event(sequence: int, text: str = "") -> tuple[int, str]:
    return sequence, json.dumps({"sequence_number": sequence, "text": text})


async def test_events_are_read_back_in_order_after_a_position(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        await runs.create_run(RunRecord(id="r1", user_id=user_id, session_id="s1"))
        await runs.append_events(user_id, "r1", [_event(0), _event(1, "é🙂"), _event(2)])
        await runs.append_events(user_id, "r1", [_event(3)])
        assert [s for s, _ in await runs.read_events(user_id, "r1")] == [0, 1, 2, 3]
        after = await runs.read_events(user_id, "r1", after=1)
        assert [s for s, _ in after] == [2, 3]
        assert json.loads((await runs.read_events(user_id, "r1", after=0, limit=1))[0][1]) == {
            "sequence_number": 1,
            "text": "é🙂",
        }


async def test_a_position_before_the_first_event_or_past_any_reads_all_or_none(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        await runs.create_run(RunRecord(id="appended", user_id=user_id))
        await runs.append_events(user_id, "appended", [_event(0), _event(1)])
        await runs.finish_run(user_id, "appended", "completed")
        whole = RunRecord(id="whole", user_id=user_id, status="completed")
        await runs.record(whole, [_event(0), _event(1)], create=True, finish=True)
        for run_id in ("appended", "whole"):
            for after in (-2, -(2**70)):
                assert [s for s, _ in await runs.read_events(user_id, run_id, after)] == [0, 1]
            for after in (2**63 - 1, 2**64, 10**30):
                assert await runs.read_events(user_id, run_id, after) == []
                assert [s async for s, _ in runs.follow(user_id, run_id, after)] == []


async def test_an_event_appended_twice_is_stored_once(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        await runs.create_run(RunRecord(id="r1", user_id=user_id))
        await runs.append_events(user_id, "r1", [_event(0), _event(1)])
        await runs.append_events(user_id, "r1", [_event(1), _event(2)])
        assert [s for s, _ in await runs.read_events(user_id, "r1")] == [0, 1, 2]


async def test_a_large_event_is_stored_whole(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    big = "x" * 600_000
    async with runs_factory() as runs:
        await runs.create_run(RunRecord(id="big", user_id=user_id))
        await runs.append_events(user_id, "big", [_event(0, big), _event(1)])
        events = await runs.read_events(user_id, "big")
        assert [s for s, _ in events] == [0, 1] and json.loads(events[0][1])["text"] == big


async def test_a_record_larger_than_a_store_item_is_kept_whole(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    big = {"report": "ü" * 600_000}  # 1.2 MB of UTF-8: more than a DynamoDB item
    async with runs_factory() as runs:
        await runs.create_run(RunRecord(id="t1", user_id=user_id, session_id="s1", kind="task"))
        await runs.request_cancel(user_id, "t1")
        await runs.finish_run(user_id, "t1", "completed", result=big)
        stored = await runs.get_run(user_id, "t1")
        assert stored is not None and stored.result == big and stored.cancel_requested
        await runs.save_run(stored.model_copy(update={"result": "small"}))
        assert (await runs.get_run(user_id, "t1")).result == "small"  # type: ignore[union-attr]
        await runs.save_run(stored.model_copy(update={"result": big, "status": "failed"}))
        [listed] = await runs.list_runs(user_id, "s1")
        assert listed.result == big and listed.status == "failed"
        whole = RunRecord(id="a1", user_id=user_id, kind="a2a_task", result=big)
        await runs.record(whole, [_event(0)], create=True)
        assert (await runs.get_run(user_id, "a1")).result == big  # type: ignore[union-attr]


async def test_a_large_record_rewritten_as_it_grows_is_kept_whole(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    # An A2A task's record holds its reply so far, rewritten as it grows: on the local
    # emulator, a rewrite from 200 KB to 300 KB was refused as over DynamoDB's 400 KB (the
    # attribute replaced was counted twice), and the task broke off mid-reply.
    async with runs_factory() as runs:
        record = RunRecord(id="a1", user_id=user_id, session_id="s1", kind="a2a_task")
        await runs.create_run(record)
        for size in (200_000, 300_000, 390_000, 800_000, 900_000):
            await runs.save_run(record.model_copy(update={"result": {"reply": "x" * size}}))
            stored = await runs.get_run(user_id, "a1")
            assert stored is not None and len(stored.result["reply"]) == size


async def test_a_run_finishes_with_its_status_and_a_tasks_result_or_error(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        await runs.create_run(RunRecord(id="t1", user_id=user_id, kind="task", name="/jobs"))
        record = await runs.get_run(user_id, "t1")
        assert record is not None and record.status == "in_progress" and not record.finished
        await runs.finish_run(user_id, "t1", "completed", result={"n": [1, 2]})
        done = await runs.get_run(user_id, "t1")
        assert done is not None and done.finished
        assert (done.status, done.result, done.kind, done.name) == (
            "completed",
            {"n": [1, 2]},
            "task",
            "/jobs",
        )
        with pytest.raises(InvalidInputError):
            await runs.finish_run(user_id, "t1", "in_progress")


async def test_cancel_marks_a_running_run_and_another_object_sees_it(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as running, runs_factory() as elsewhere:
        await running.create_run(RunRecord(id="r1", user_id=user_id))
        assert not await running.cancel_requested(user_id, "r1")
        marked = await elsewhere.request_cancel(user_id, "r1")
        assert marked is not None and marked.cancel_requested
        assert await running.cancel_requested(user_id, "r1")
        await running.finish_run(user_id, "r1", "canceled")
        ended = await elsewhere.request_cancel(user_id, "r1")
        assert ended is not None and ended.status == "canceled"
        assert await elsewhere.request_cancel(user_id, "missing") is None


async def test_runs_are_listed_per_session_oldest_first(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        for index, session in enumerate(["a", "b", "a"]):
            record = RunRecord(id=f"r{index}", user_id=user_id, session_id=session)
            await runs.create_run(record.model_copy(update={"created_at": 1000.0 + index}))
        assert [r.id for r in await runs.list_runs(user_id, "a")] == ["r0", "r2"]
        assert [r.id for r in await runs.list_runs(user_id, " a\t")] == ["r0", "r2"]
        assert await runs.list_runs(user_id, "nobody") == []
        for bad in ("", "  ", "\x00", "a\x1cb", "\ud800"):
            with pytest.raises(InvalidInputError):
                await runs.list_runs(user_id, bad)


async def test_a_users_recent_runs_are_listed_oldest_first_with_their_fingerprints(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    # What an OpenAI SDK's retry looks for: the run its first try started, and the seed of
    # its input's ids (a retry running it again once canceled stores the input once).
    now = time.time()
    async with runs_factory() as runs:
        for index, (session, age) in enumerate([("a", 900.0), ("b", 20.0), ("a", 10.0)]):
            record = RunRecord(
                id=f"r{index}",
                user_id=user_id,
                session_id=session,
                kind="openai",
                fingerprint=f"request {index}",
                input_seed=f"seed {index}",
                created_at=now - age,
            )
            await runs.create_run(record)
        await runs.create_run(
            RunRecord(id="theirs", user_id=f"{user_id}-other", created_at=now - 5.0)
        )
        recent = await runs.recent_runs(user_id, now - 60.0)
        assert [(r.id, r.fingerprint, r.input_seed) for r in recent] == [
            ("r1", "request 1", "seed 1"),
            ("r2", "request 2", "seed 2"),
        ]
        assert [r.id for r in await runs.recent_runs(user_id, 0.0)] == ["r0", "r1", "r2"]


async def test_a_user_never_reaches_another_users_run(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    other = f"{user_id}-other"
    async with runs_factory() as runs:
        await runs.create_run(RunRecord(id="r1", user_id=user_id, session_id="s"))
        await runs.append_events(user_id, "r1", [_event(0)])
        assert await runs.get_run(other, "r1") is None
        assert await runs.read_events(other, "r1") == []
        assert await runs.request_cancel(other, "r1") is None
        assert await runs.list_runs(other, "s") == []
        await runs.append_events(other, "r1", [_event(1)])
        assert [s for s, _ in await runs.read_events(user_id, "r1")] == [0]


async def test_follow_replays_then_streams_until_the_run_ends(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as writer, runs_factory() as reader:
        reader.poll_seconds = 0.05
        await writer.create_run(RunRecord(id="r1", user_id=user_id))
        await writer.append_events(user_id, "r1", [_event(0), _event(1)])

        async def finish_later() -> None:
            await asyncio.sleep(0.2)
            await writer.append_events(user_id, "r1", [_event(2)])
            await writer.finish_run(user_id, "r1", "completed")

        finishing = asyncio.create_task(finish_later())
        followed = [s async for s, _ in reader.follow(user_id, "r1", after=0)]
        await finishing
        assert followed == [1, 2]
        assert [s async for s, _ in reader.follow(user_id, "missing")] == []


async def test_a_follower_of_a_run_deleted_between_two_polls_gets_its_readable_events(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    # Its session deleted, the run is cancelled and stores its final event after its record
    # went: a store may hold it a moment (DynamoDB deletes a run's items one batch after
    # another, and what a run writes once its record went just after writing it), and a
    # follower polling then gets it, its stream ending with it.
    async with runs_factory() as writer, runs_factory() as reader:
        record = RunRecord(id="r1", user_id=user_id, session_id="s")
        await writer.create_run(record)
        await writer.append_events(user_id, "r1", [_event(0), _event(1)])
        following = reader.follow(user_id, "r1")
        assert [await anext(following), await anext(following)] == [_event(0), _event(1)]
        await writer.delete_session_runs(user_id, "s")
        await writer.record(record.model_copy(update={"status": "canceled"}), [_event(2)])
        readable = await writer.read_events(user_id, "r1", after=1)
        assert readable in ([], [_event(2)])
        assert [event async for event in following] == readable


async def _erase(runs: RunsService, user_id: str, what: str) -> None:
    if what == "session":
        await runs.delete_session_runs(user_id, "s")
    else:
        await runs.delete_user_runs(user_id)


@pytest.mark.parametrize("erased", ["session", "user"])
async def test_a_run_deleted_while_it_executes_keeps_nothing_it_writes_afterwards(
    runs_factory: Callable[[], RunsService],
    runs_leftovers: RunsLeftovers,
    user_id: str,
    erased: str,
) -> None:
    # Its session deleted (or its user erased) mid-run, the run goes on: its last content
    # events, then its final record with its final event (a large one each, and a large
    # result: stored in several items where a store's item is bounded).
    async with runs_factory() as runs:
        record = RunRecord(id="r1", user_id=user_id, session_id="s")
        await runs.record(record, [_event(0, "secret")], create=True)
        await runs.append_events(user_id, "r1", [_event(1, "secret")])
        await _erase(runs, user_id, erased)
        await runs.append_events(user_id, "r1", [_event(2, "secret" * 100_000)])
        await runs.beat(record)
        final = record.model_copy(update={"status": "canceled", "result": "secret" * 100_000})
        await runs.record(final, [_event(3, "secret" * 100_000)], finish=True)
        await runs.save_run(final)
        assert await runs.get_run(user_id, "r1") is None
        assert await runs.read_events(user_id, "r1") == []
        assert await runs.list_runs(user_id, "s") == []
        assert await runs_leftovers(user_id) == []


async def test_a_run_deleted_while_it_writes_keeps_nothing_whatever_the_timing(
    runs_factory: Callable[[], RunsService], runs_leftovers: RunsLeftovers, user_id: str
) -> None:
    async with runs_factory() as runs:

        async def execute(record: RunRecord) -> None:
            for sequence in range(1, 6):
                await runs.append_events(record.user_id, record.id, [_event(sequence, "secret")])
            final = record.model_copy(update={"status": "canceled"})
            await runs.record(final, [_event(6, "secret")], finish=True)

        for i in range(20):
            record = RunRecord(id=f"r{i}", user_id=user_id, session_id="s")
            await runs.record(record, [_event(0, "secret")], create=True)
            deleting = _erase(runs, user_id, "session" if i % 2 else "user")
            await asyncio.gather(deleting, execute(record))
        assert await runs_leftovers(user_id) == []


async def test_ids_are_checked(runs_factory: Callable[[], RunsService], user_id: str) -> None:
    async with runs_factory() as runs:
        with pytest.raises(InvalidInputError):
            await runs.get_run(user_id, "")
        with pytest.raises(InvalidInputError):
            await runs.get_run(user_id, "r" * 257)
        with pytest.raises(InvalidInputError):
            await runs.create_run(RunRecord(id="r1", user_id=""))


async def test_a_read_of_events_refuses_a_position_or_a_limit_that_is_no_count(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        await runs.create_run(RunRecord(id="r1", user_id=user_id))
        await runs.append_events(user_id, "r1", [_event(0), _event(1)])
        # A limit of 0 read nothing in memory and every event elsewhere; a position of 0.5
        # failed in the stores' own ways, one of them a store error.
        for after, limit in ((-1, 0), (-1, -1), (-1, True), (0.5, None), (True, None)):
            with pytest.raises(InvalidInputError):
                await runs.read_events(user_id, "r1", after, limit)  # type: ignore[arg-type]
        assert [s for s, _ in await runs.read_events(user_id, "r1", 0, 1)] == [1]


async def test_a_burst_creates_appends_and_finishes_in_one_call(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        record = RunRecord(id="b1", user_id=user_id, session_id="s1")
        assert not await runs.record(record, [_event(0), _event(1, "a\nb")], create=True)
        assert [r.id for r in await runs.list_runs(user_id, "s1")] == ["b1"]
        await runs.request_cancel(user_id, "b1")
        done = record.model_copy(update={"status": "completed"})
        requested = await runs.record(done, [_event(2)], finish=True)
        assert requested in (True, None)  # None: the store cannot tell without a read
        stored = await runs.get_run(user_id, "b1")
        assert stored is not None and stored.status == "completed" and stored.cancel_requested
        events = await runs.read_events(user_id, "b1")
        assert [s for s, _ in events] == [0, 1, 2]
        assert json.loads(events[1][1])["text"] == "a\nb"


async def test_a_whole_run_in_one_burst_is_stored_finished(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        record = RunRecord(id="w1", user_id=user_id, status="failed")
        await runs.record(record, [_event(0), _event(1)], create=True, finish=True)
        stored = await runs.get_run(user_id, "w1")
        assert stored is not None and stored.status == "failed"
        assert [s for s, _ in await runs.read_events(user_id, "w1")] == [0, 1]
        with pytest.raises(InvalidInputError):
            await runs.record(record.model_copy(update={"status": "busy"}), [], finish=True)


async def test_a_burst_of_an_unknown_run_does_not_create_it(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        ghost = RunRecord(id="ghost", user_id=user_id, status="completed")
        await runs.record(ghost, [_event(0)], finish=True)
        assert await runs.get_run(user_id, "ghost") is None


async def test_bursts_of_several_runs_are_stored_together(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        first = RunRecord(id="m1", user_id=user_id, session_id="s")
        second = RunRecord(id="m2", user_id=user_id, session_id="s", status="completed")
        answers = await runs.record_many(
            [
                RunBurst(first, [_event(0), _event(1)], create=True),
                RunBurst(second, [_event(0)], create=True, finish=True),
            ]
        )
        assert answers in ([False, False], [None, None])
        await runs.request_cancel(user_id, "m1")
        done = first.model_copy(update={"status": "canceled"})
        (answer,) = await runs.record_many([RunBurst(done, [_event(2)], finish=True)])
        assert answer in (True, None)
        stored = {r.id: r.status for r in await runs.list_runs(user_id, "s")}
        assert stored == {"m1": "canceled", "m2": "completed"}
        assert [s for s, _ in await runs.read_events(user_id, "m1")] == [0, 1, 2]
        assert [s for s, _ in await runs.read_events(user_id, "m2")] == [0]


async def test_a_long_burst_and_overlapping_appends_read_back_once_each(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        record = RunRecord(id="long", user_id=user_id)
        await runs.record(record, [_event(s, f"e{s}") for s in range(1_234)], create=True)
        await runs.append_events(user_id, "long", [_event(s, "again") for s in range(1_230, 1_240)])
        await runs.append_events(user_id, "long", [_event(5, "again")])
        events = await runs.read_events(user_id, "long")
        assert [s for s, _ in events] == list(range(1_240))
        texts = [json.loads(data)["text"] for _, data in events]
        assert texts[6:1_230] == [f"e{s}" for s in range(6, 1_230)]
        assert texts[1_234:] == ["again"] * 6
        # Positions inside a write: what follows them, and no more than asked.
        after = await runs.read_events(user_id, "long", after=1_231, limit=3)
        assert [s for s, _ in after] == [1_232, 1_233, 1_234]
        assert [s for s, _ in await runs.read_events(user_id, "long", after=498)][:2] == [499, 500]


async def test_bursts_of_several_users_are_stored_together_each_for_its_user(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    other = f"{user_id}-other"
    async with runs_factory() as runs:
        mine = RunRecord(id="same", user_id=user_id, status="completed")
        theirs = RunRecord(id="same", user_id=other, status="failed")
        await runs.record_many(
            [
                RunBurst(mine, [_event(0, "mine")], create=True, finish=True),
                RunBurst(theirs, [_event(0, "theirs"), _event(1)], create=True, finish=True),
            ]
        )
        for user, status, texts in (
            (user_id, "completed", ["mine"]),
            (other, "failed", ["theirs", ""]),
        ):
            stored = await runs.get_run(user, "same")
            assert stored is not None and stored.status == status
            events = await runs.read_events(user, "same")
            assert [json.loads(data)["text"] for _, data in events] == texts


async def test_event_text_is_stored_as_given_whatever_characters_it_holds(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    # Pretty-printed JSON (raw line breaks), commas, tabs, NUL and non-ASCII text: stored and
    # read back byte for byte, by a burst and by an append alike.
    odd = ['{\n  "a": 1\n}', "x,y\n\n,z", "\t\r\n\x00", "é🙂\n" * 100, ""]
    async with runs_factory() as runs:
        record = RunRecord(id="odd", user_id=user_id)
        await runs.record(record, list(enumerate(odd)), create=True)
        await runs.append_events(user_id, "odd", [(len(odd) + i, t) for i, t in enumerate(odd)])
        assert [data for _, data in await runs.read_events(user_id, "odd")] == odd + odd


async def test_deleting_a_users_runs_deletes_every_one_of_theirs_only(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    other = f"{user_id}:other"
    async with runs_factory() as runs:
        for user in (user_id, other):
            await runs.create_run(RunRecord(id="open", user_id=user, session_id="s1"))
            await runs.append_events(user, "open", [_event(0, "secret"), _event(1)])
            whole = RunRecord(id="whole", user_id=user, session_id="a:b{c}*", status="completed")
            await runs.record(whole, [_event(0, "secret")], create=True, finish=True)
            burst = RunRecord(id="burst", user_id=user, session_id="s1")
            await runs.record(burst, [_event(0, "secret")], create=True)
            task = RunRecord(id="task", user_id=user, kind="task", result={"r": "x" * 600_000})
            await runs.create_run(task)
        await runs.delete_user_runs(user_id)
        for run_id in ("open", "whole", "burst", "task"):
            assert await runs.get_run(user_id, run_id) is None
            assert await runs.read_events(user_id, run_id) == []
            assert await runs.get_run(other, run_id) is not None
        assert await runs.list_runs(user_id, "s1") == []
        assert await runs.list_runs(user_id, "a:b{c}*") == []
        assert [r.id for r in await runs.list_runs(other, "s1")] == ["open", "burst"]
        assert [s for s, _ in await runs.read_events(other, "open")] == [0, 1]
        # Again is harmless, and the user starts afresh.
        await runs.delete_user_runs(user_id)
        await runs.delete_user_runs(f"{user_id}-nobody")
        await runs.create_run(RunRecord(id="open", user_id=user_id, session_id="s1"))
        assert await runs.read_events(user_id, "open") == []
        assert [r.id for r in await runs.list_runs(user_id, "s1")] == ["open"]


async def test_deleting_a_users_runs_goes_past_one_batch(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        bursts = [
            RunBurst(RunRecord(id=f"r{i}", user_id=user_id, session_id=f"s{i % 3}"), [_event(0)])
            for i in range(210)  # past one batch of the Redis erase (200)
        ]
        for start in range(0, len(bursts), 50):
            await runs.record_many(
                [RunBurst(b.record, b.events, create=True) for b in bursts[start : start + 50]]
            )
        await runs.delete_user_runs(user_id)
        for i in (0, 199, 200, 209):
            assert await runs.get_run(user_id, f"r{i}") is None
        assert all([await runs.list_runs(user_id, f"s{i}") == [] for i in range(3)])


async def test_deleting_a_sessions_runs_keeps_the_users_other_runs(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    other = f"{user_id}:other"
    async with runs_factory() as runs:
        for user in (user_id, other):
            for session in ("gone", "kept"):
                await runs.create_run(
                    RunRecord(id=f"{session}-1", user_id=user, session_id=session)
                )
                await runs.append_events(user, f"{session}-1", [_event(0, "secret")])
                whole = RunRecord(
                    id=f"{session}-2", user_id=user, session_id=session, status="completed"
                )
                await runs.record(whole, [_event(0, "secret")], create=True, finish=True)
            await runs.create_run(RunRecord(id="task", user_id=user, kind="task"))
        await runs.delete_session_runs(user_id, " gone ")  # taken as sessions take it
        for run_id in ("gone-1", "gone-2"):
            assert await runs.get_run(user_id, run_id) is None
            assert await runs.read_events(user_id, run_id) == []
        assert await runs.list_runs(user_id, "gone") == []
        assert [r.id for r in await runs.list_runs(user_id, "kept")] == ["kept-1", "kept-2"]
        assert await runs.get_run(user_id, "task") is not None
        assert [r.id for r in await runs.list_runs(other, "gone")] == ["gone-1", "gone-2"]
        await runs.delete_session_runs(user_id, "gone")
        with pytest.raises(InvalidInputError):
            await runs.delete_session_runs(user_id, " ")
        # The user's index lost them too: erasing the user deletes what is left.
        await runs.delete_user_runs(user_id)
        for run_id in ("kept-1", "kept-2", "task"):
            assert await runs.get_run(user_id, run_id) is None
        assert await runs.get_run(other, "kept-1") is not None


async def test_deleting_a_run_that_ended_leaves_only_the_mark_that_it_was(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    other = f"{user_id}:other"
    async with runs_factory() as runs:
        for user in (user_id, other):
            for run_id in ("gone", "kept"):
                record = RunRecord(id=run_id, user_id=user, session_id="s", status="completed")
                await runs.record(record, [_event(0, "secret")], create=True, finish=True)
        await runs.create_run(RunRecord(id="going", user_id=user_id, session_id="s"))
        deleted = await runs.delete_run(user_id, "gone")
        assert deleted is not None and (deleted.id, deleted.status) == ("gone", "completed")
        assert await runs.get_run(user_id, "gone") is None
        assert await runs.read_events(user_id, "gone") == []
        assert [r.id for r in await runs.list_runs(user_id, "s")] == ["kept", "going"]
        assert [r.id for r in await runs.recent_runs(user_id, 0)] == ["kept", "going"]
        assert await runs.was_deleted(user_id, "gone")
        assert not await runs.was_deleted(user_id, "kept")
        assert await runs.delete_run(user_id, "gone") is None
        assert await runs.delete_run(user_id, "never") is None
        # A run in progress is not deleted; another user's run of the same id stays.
        going = await runs.delete_run(user_id, "going")
        assert going is not None and not going.finished
        assert await runs.get_run(user_id, "going") is not None
        assert await runs.get_run(other, "gone") is not None
        assert not await runs.was_deleted(other, "gone")
        await runs.delete_user_runs(user_id)
        assert not await runs.was_deleted(user_id, "gone")


async def test_a_run_discarded_leaves_its_id_to_a_new_run_alone(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    # A new run under a lost run's id (a keyed request's retry) read back the lost run's
    # events after its own, and (DynamoDB) was listed twice.
    other = f"{user_id}:other"
    async with runs_factory() as runs:
        await _record_lost_run(runs, user_id)
        await runs.append_events(user_id, "lost", [_event(3, "stale"), _event(4, "stale")])
        await _record_lost_run(runs, other)
        await runs.discard_run(user_id, "lost")
        await runs.discard_run(user_id, "never")
        assert await runs.get_run(user_id, "lost") is None
        assert not await runs.was_deleted(user_id, "lost")
        assert await runs.read_events(user_id, "lost") == []
        assert await runs.list_runs(user_id, "s1") == []
        assert await runs.recent_runs(user_id, 0) == []
        assert await runs.get_run(other, "lost") is not None  # another user's run stays
        again = RunRecord(id="lost", user_id=user_id, session_id="s1")
        await runs.record(again, [_response(0, "created"), _event(1, "new")], create=True)
        assert [r.id for r in await runs.list_runs(user_id, "s1")] == ["lost"]
        events = await runs.read_events(user_id, "lost")
        assert [(s, json.loads(data).get("text")) for s, data in events] == [
            (0, None),
            (1, "new"),
        ]


async def test_deleting_a_users_runs_races_with_runs_being_stored(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        for i in range(20):
            await runs.create_run(RunRecord(id=f"old{i}", user_id=user_id, session_id="s"))

        async def writer(i: int) -> None:
            record = RunRecord(id=f"new{i}", user_id=user_id, session_id="s")
            await runs.record(record, [_event(0, "secret")], create=True)
            await runs.append_events(user_id, f"new{i}", [_event(1)])

        await asyncio.gather(runs.delete_user_runs(user_id), *(writer(i) for i in range(10)))
        # What existed before is gone; what was stored meanwhile is listed when it is there.
        for i in range(20):
            assert await runs.get_run(user_id, f"old{i}") is None
        listed = {record.id for record in await runs.list_runs(user_id, "s")}
        for i in range(10):
            present = await runs.get_run(user_id, f"new{i}") is not None
            assert present == (f"new{i}" in listed)
        # A second erase finds whatever the first one missed.
        await runs.delete_user_runs(user_id)
        assert await runs.list_runs(user_id, "s") == []
        for i in range(10):
            assert await runs.get_run(user_id, f"new{i}") is None


async def _asked(runs: RunsService, user_id: str, run_id: str) -> None:
    """Return once the run's cancellation is requested (a running run polls its mark)."""
    while not await runs.cancel_requested(user_id, run_id):  # noqa: ASYNC110
        await asyncio.sleep(0.01)


async def _end_when_asked(runs: RunsService, user_id: str, run_id: str) -> None:
    """What a running run does: it watches its mark, and ends as canceled once asked."""
    await _asked(runs, user_id, run_id)
    await runs.finish_run(user_id, run_id, "canceled")


async def test_stopping_a_users_runs_asks_those_in_progress_and_waits_for_their_end(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    other = f"{user_id}:other"
    async with runs_factory() as runs:
        runs.poll_seconds = 0.02
        for user in (user_id, other):
            for i in range(3):
                await runs.create_run(RunRecord(id=f"live{i}", user_id=user, session_id="s"))
            done = RunRecord(id="done", user_id=user, session_id="s", status="completed")
            await runs.record(done, [_event(0)], create=True, finish=True)
            await runs.create_run(RunRecord(id="task", user_id=user, kind="task"))
        ends = [asyncio.create_task(_end_when_asked(runs, user_id, f"live{i}")) for i in range(3)]
        assert await runs.stop_runs(user_id, wait=10) == []
        await asyncio.gather(*ends)
        for i in range(3):
            assert (await runs.get_run(user_id, f"live{i}")).status == "canceled"  # type: ignore[union-attr]
            assert not (await runs.get_run(other, f"live{i}")).cancel_requested  # type: ignore[union-attr]
        # A background task does not watch its mark: it is left running, unmarked.
        assert not (await runs.get_run(user_id, "task")).cancel_requested  # type: ignore[union-attr]
        assert (await runs.get_run(user_id, "done")).status == "completed"  # type: ignore[union-attr]


async def test_stopping_gives_up_at_the_timeout_naming_the_runs_still_in_progress(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        runs.poll_seconds = 0.02
        for session in ("a", "b"):
            await runs.create_run(
                RunRecord(id=f"dead-{session}", user_id=user_id, session_id=session)
            )
        # A run whose process died stays in progress: it is marked, and waited for no longer.
        assert await runs.stop_runs(user_id, " a ", wait=0.2) == ["dead-a"]
        assert (await runs.get_run(user_id, "dead-a")).cancel_requested  # type: ignore[union-attr]
        assert not (await runs.get_run(user_id, "dead-b")).cancel_requested  # type: ignore[union-attr]
        listed = {r.id: r.cancel_requested for s in "ab" for r in await runs.list_runs(user_id, s)}
        assert listed == {"dead-a": True, "dead-b": False}
        assert sorted(await runs.stop_runs(user_id, wait=0.2)) == ["dead-a", "dead-b"]
        assert await runs.stop_runs(f"{user_id}-nobody", wait=0.2) == []
        with pytest.raises(InvalidInputError):
            await runs.stop_runs(user_id, " ")


async def test_stopping_finds_a_run_stored_while_it_waited(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    async with runs_factory() as runs:
        runs.poll_seconds = 0.02
        await runs.create_run(RunRecord(id="first", user_id=user_id, session_id="s"))

        async def first_then_another() -> None:
            await _asked(runs, user_id, "first")
            # Started just before the erase listed runs, stored just after.
            await runs.create_run(RunRecord(id="late", user_id=user_id, session_id="s"))
            await runs.finish_run(user_id, "first", "canceled")
            await _end_when_asked(runs, user_id, "late")

        running = asyncio.create_task(first_then_another())
        assert await runs.stop_runs(user_id, wait=10) == []
        await asyncio.wait_for(running, 10)
        assert (await runs.get_run(user_id, "late")).status == "canceled"  # type: ignore[union-attr]


@pytest.mark.parametrize("session_id", [None, "s"])
async def test_stopping_finds_a_run_started_before_it_not_stored_yet(
    runs_factory: Callable[[], RunsService], user_id: str, session_id: str | None
) -> None:
    async with runs_factory() as runs:
        runs.poll_seconds = 0.02
        # A store on a loaded test machine (moto, a Redis Cluster) takes longer to write than
        # one in the cloud: the second listing waits for the write whatever its time.
        runs.write_seconds = 1.0

        async def started_just_before() -> None:
            # A run executing elsewhere: it writes its record a first write delay after its
            # first event (which its client saw before erasing).
            await asyncio.sleep(FIRST_WRITE_DELAY)
            await runs.create_run(RunRecord(id="late", user_id=user_id, session_id="s"))
            await _end_when_asked(runs, user_id, "late")

        running = asyncio.create_task(started_just_before())
        try:
            assert await runs.stop_runs(user_id, session_id, wait=10) == []
            late = await runs.get_run(user_id, "late")
            assert late is not None and late.status == "canceled"
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)


_LOST = {"code": RUN_LOST, "message": "the process running the run stopped before the run ended"}


def _response(sequence: int, status: str) -> tuple[int, str]:
    return sequence, json.dumps(
        {"sequence_number": sequence, "object": "response", "id": "lost", "status": status}
    )


def _task_status(record: RunRecord) -> tuple[str, str]:
    """The state of the A2A task ``record`` holds, and its status message's text."""
    status = record.result["status"]
    return status["state"], "".join(p["text"] for p in status.get("message", {}).get("parts", []))


async def _record_lost_run(runs: RunsService, user_id: str) -> None:
    """The run ``lost`` of session s1, whose heartbeat stopped after its third event."""
    stale = time.time() - LOST_AFTER_SECONDS - 5
    lost = RunRecord(id="lost", user_id=user_id, session_id="s1", updated_at=stale)
    events = [_response(0, "created"), _response(1, "in_progress"), _event(2, "half")]
    await runs.record(lost, events, create=True)


async def test_a_run_whose_heartbeat_stopped_is_seen_failed_and_its_followers_told(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    # Its process died (a Lambda timeout): it stayed in progress until its expiry, a
    # follower of its events waited for ever, a cancel answered 202 and an erase waited.
    async with runs_factory() as runs:
        await _record_lost_run(runs, user_id)
        # The record of an A2A task is the SDK's, saved with no heartbeat: one just made, its
        # run not named yet, is in progress.
        task = RunRecord(id="task", user_id=user_id, kind="a2a_task")
        await runs.create_run(task)
        seen = await runs.get_run(user_id, "lost")
        assert seen is not None and seen.status == "failed"
        assert seen.error == {
            "code": RUN_LOST,
            "message": "the process running the run stopped before the run ended",
        }
        assert [r.status for r in await runs.list_runs(user_id, "s1")] == ["failed"]
        assert (await runs.get_run(user_id, "task")).status == "in_progress"  # type: ignore[union-attr]
        cancel = await runs.request_cancel(user_id, "lost")
        assert cancel is not None and cancel.finished
        followed = [item async for item in runs.follow(user_id, "lost", 1)]
        assert [s for s, _ in followed] == [2, 3]
        ending = json.loads(followed[-1][1])
        assert (ending["object"], ending["status"], ending["sequence_number"]) == (
            "response",
            "failed",
            3,
        )
        assert ending["error"]["code"] == RUN_LOST
        assert await runs.stop_runs(user_id, wait=0.5) == ["task"]  # the lost one: not waited for


async def test_an_a2a_task_whose_run_was_lost_is_seen_failed_and_not_waited_for(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    # Its run read as lost, but the task's record (no heartbeat of its own) stayed in
    # progress until it expired: its followers polled without end, an erase waited for it.
    async with runs_factory() as runs:
        await _record_lost_run(runs, user_id)
        working = {
            "id": "task",
            "contextId": "s1",
            "status": {"state": "TASK_STATE_WORKING"},
            "metadata": {"run_id": "lost"},
        }
        task = RunRecord(
            id="task", user_id=user_id, session_id="s1", kind="a2a_task", result=working
        )
        await runs.create_run(task)
        seen = await runs.get_run(user_id, "task")
        assert seen is not None and (seen.status, seen.error) == ("failed", _LOST)
        # The task it holds says so too (it said working).
        assert _task_status(seen) == ("TASK_STATE_FAILED", _LOST["message"])
        listed = await runs.list_runs(user_id, "s1")
        assert [(r.id, r.status) for r in listed] == [("lost", "failed"), ("task", "failed")]
        assert [r.status for r in await runs.recent_runs(user_id, 0)] == ["failed", "failed"]
        assert [item async for item in runs.follow(user_id, "task")] == []
        assert await runs.stop_runs(user_id, "s1", wait=0.5) == []
        assert await runs.stop_runs(user_id, wait=0.5) == []


async def test_an_a2a_task_that_never_had_a_run_stored_is_seen_failed_once_clearly_lost(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    # Its instance died between making the task and its first update (naming its run), or
    # before the run it named was stored: the task's record stayed in progress until it
    # expired, its followers polled without end and an erase waited for it.
    stale = time.time() - LOST_AFTER_SECONDS - 5
    submitted = {"id": "unnamed", "contextId": "s1", "status": {"state": "TASK_STATE_SUBMITTED"}}
    named = {
        "id": "unstored",
        "contextId": "s1",
        "status": {"state": "TASK_STATE_WORKING"},
        "metadata": {"run_id": "never-stored"},
    }
    async with runs_factory() as runs:
        for result in (submitted, named):
            await runs.create_run(
                RunRecord(
                    id=result["id"],
                    user_id=user_id,
                    session_id="s1",
                    kind="a2a_task",
                    result=result,
                    updated_at=stale,
                )
            )
        # One just made has its first update to come: it is not taken for lost.
        fresh = RunRecord(
            id="fresh", user_id=user_id, session_id="s1", kind="a2a_task", result=submitted
        )
        await runs.create_run(fresh)
        for task_id in ("unnamed", "unstored"):
            seen = await runs.get_run(user_id, task_id)
            assert seen is not None and (seen.status, seen.error) == ("failed", _LOST)
            assert _task_status(seen) == ("TASK_STATE_FAILED", _LOST["message"])
            assert [item async for item in runs.follow(user_id, task_id)] == []
        assert (await runs.get_run(user_id, "fresh")).status == "in_progress"  # type: ignore[union-attr]
        listed = {r.id: r.status for r in await runs.list_runs(user_id, "s1")}
        assert listed == {"unnamed": "failed", "unstored": "failed", "fresh": "in_progress"}
        recent = {r.id: r.status for r in await runs.recent_runs(user_id, 0)}
        assert recent == listed
        assert await runs.stop_runs(user_id, "s1", wait=0.5) == ["fresh"]


async def test_a_follower_resuming_after_a_lost_runs_ending_is_not_told_again(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    # Each resume after the ending (its id sent back as Last-Event-ID, as EventSource does
    # on reconnecting) got another ending, numbered one further each time.
    async with runs_factory() as runs:
        await _record_lost_run(runs, user_id)
        [(ending, _)] = [item async for item in runs.follow(user_id, "lost", 2)]
        assert ending == 3
        assert [item async for item in runs.follow(user_id, "lost", ending)] == []
        assert [item async for item in runs.follow(user_id, "lost", 10**9)] == []


async def test_a_heartbeat_keeps_a_run_in_progress_and_never_makes_a_deleted_one(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    stale = time.time() - LOST_AFTER_SECONDS - 5
    async with runs_factory() as runs:
        running = RunRecord(id="beating", user_id=user_id, session_id="s1", updated_at=stale)
        await runs.record(running, [_event(0)], create=True)
        await runs.beat(running)
        again = await runs.get_run(user_id, "beating")
        assert again is not None and again.status == "in_progress"
        await runs.delete_user_runs(user_id)
        await runs.beat(running)
        assert await runs.get_run(user_id, "beating") is None


async def _run_written_for_three_ttls(
    runs: RunsService, runs_aging: RunsAging, user_id: str
) -> None:
    """The run ``long`` of session s1, started three TTLs ago and written since, three
    quarters of a TTL apart (a heartbeat and an event each time, stored in a burst or
    appended), and the run ``later``, just started."""
    step = RUNS_TTL_SECONDS * 3 // 4
    started = time.time() - 4 * step
    long = RunRecord(id="long", user_id=user_id, session_id="s1", created_at=started)
    await runs.record(long, [_event(0, "first")], create=True)
    for sequence in range(1, 5):
        await runs_aging(runs, user_id, step)
        await runs.beat(long)
        if sequence % 2:
            await runs.record(long, [_event(sequence)])
        else:
            await runs.append_events(user_id, "long", [_event(sequence)])
    await runs.create_run(RunRecord(id="later", user_id=user_id, session_id="s1"))


async def test_a_run_written_for_longer_than_the_ttl_keeps_all_of_it_until_a_ttl_after(
    runs_factory: Callable[[], RunsService], runs_aging: RunsAging, user_id: str
) -> None:
    # A background task beating for minutes (RUNS_TTL_SECONDS=60): its first events
    # expired while it ran (a client resuming from the start missed them), and it dropped
    # out of its session's runs and its user's.
    async with runs_factory() as runs:
        await _run_written_for_three_ttls(runs, runs_aging, user_id)
        seen = await runs.get_run(user_id, "long")
        assert seen is not None and seen.status == "in_progress"
        assert [s for s, _ in await runs.read_events(user_id, "long")] == [0, 1, 2, 3, 4]
        assert [r.id for r in await runs.list_runs(user_id, "s1")] == ["long", "later"]
        assert [r.id for r in await runs.recent_runs(user_id, 0)] == ["long", "later"]

        await runs_aging(runs, user_id, RUNS_TTL_SECONDS + 1)
        assert await runs.get_run(user_id, "long") is None
        assert await runs.list_runs(user_id, "s1") == []
        assert await runs.recent_runs(user_id, 0) == []


@pytest.mark.parametrize("erase", ["user", "session"])
async def test_erasing_finds_a_run_written_for_longer_than_the_ttl(
    runs_factory: Callable[[], RunsService],
    runs_aging: RunsAging,
    runs_leftovers: RunsLeftovers,
    user_id: str,
    erase: str,
) -> None:
    # Its entries in the indexes an erase reads had expired (and been dropped): its record
    # and events outlived the erase of its user's data, or of its session.
    async with runs_factory() as runs:
        await _run_written_for_three_ttls(runs, runs_aging, user_id)
        if erase == "user":
            await runs.delete_user_runs(user_id)
        else:
            await runs.delete_session_runs(user_id, "s1")
        assert await runs.get_run(user_id, "long") is None
        assert await runs.read_events(user_id, "long") == []
        assert await runs_leftovers(user_id) == []


def _nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("result", "why"),
    [
        # Half of an emoji cut in two: kept in memory, refused by the other stores' JSON
        # encoding, which left the task in progress until it read as lost.
        ({"reply": ["fine", "cut \ud83d"]}, "result.reply.1 is not valid Unicode text"),
        # Stored, but too deep for Redis and DynamoDB to read back: every read failed.
        (_nested(200), "result nests deeper than 100 levels of arrays and objects"),
    ],
)
async def test_a_task_whose_result_no_store_can_keep_fails_saying_why(
    runs_factory: Callable[[], RunsService], user_id: str, result: Any, why: str
) -> None:
    async def unkeepable(payload: Any) -> Any:
        return result

    async def fine(payload: Any) -> Any:
        return {"reply": "whole \U0001f642", "nested": _nested(99)}

    async with runs_factory() as runs:
        for task_id, function in (("unkeepable", unkeepable), ("fine", fine)):
            task = TaskDefinition(path=f"/jobs/{task_id}", function=function)
            record = RunRecord(id=task_id, user_id=user_id, kind="task", name=task.path)
            await runs.create_run(record)
            await run_task(runs, task, user_id, task_id, {})
        failed = await runs.get_run(user_id, "unkeepable")
        assert failed is not None and failed.status == "failed" and failed.result is None
        assert failed.error is not None and failed.error["code"] == "TASK_FAILED"
        assert failed.error["message"].startswith(f"InvalidInputError: {why}")
        completed = await runs.get_run(user_id, "fine")
        assert completed is not None and completed.status == "completed"
        assert completed.result == {"reply": "whole \U0001f642", "nested": _nested(99)}


async def test_a_task_submitted_again_after_an_erase_keeps_nothing_the_earlier_one_saves(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    # The same Idempotency-Key sent again after an erase gives the task the same id: the
    # end, then the heartbeat, of the task that ran first landed in the new record.
    first = RunRecord(id="again", user_id=user_id, kind="task", name="/jobs/a", submission="one")
    async with runs_factory() as runs:
        await runs.create_run(first)
        beating = await runs.get_run(user_id, "again")  # as the first task's heartbeat saves it
        assert beating is not None and beating.submission == "one"
        await runs.delete_user_runs(user_id)
        await runs.create_run(first.model_copy(update={"submission": "two"}))
        await runs.finish_run(user_id, "again", "completed", result="one's", submission="one")
        await runs.beat(beating)
        second = await runs.get_run(user_id, "again")
        assert second is not None and second.submission == "two"
        assert (second.status, second.result) == ("in_progress", None)
        await runs.finish_run(user_id, "again", "completed", result="two's", submission="two")
        await runs.beat(beating)
        done = await runs.get_run(user_id, "again")
        assert done is not None and (done.status, done.result) == ("completed", "two's")


async def test_a_task_ending_after_its_record_was_erased_and_submitted_again_stores_nothing(
    runs_factory: Callable[[], RunsService], user_id: str
) -> None:
    released = asyncio.Event()

    async def slow(payload: Any) -> Any:
        await released.wait()
        return payload

    task = TaskDefinition(path="/jobs/slow", function=slow)
    first = RunRecord(id="slow", user_id=user_id, kind="task", name=task.path, submission="one")
    async with runs_factory() as runs:
        await runs.create_run(first)
        running = asyncio.ensure_future(run_task(runs, task, user_id, "slow", "one's", "one"))
        await asyncio.sleep(0)
        await runs.delete_user_runs(user_id)
        await runs.create_run(first.model_copy(update={"submission": "two"}))
        released.set()
        await running
        second = await runs.get_run(user_id, "slow")
        assert second is not None and second.submission == "two"
        assert (second.status, second.result) == ("in_progress", None)
