"""The in-memory runs store's reads: a run's events after a position are found without
going through those before it."""

from __future__ import annotations

from typing import Any

from agentscope_serverless.services.runs import RunRecord
from agentscope_serverless.services.runs.in_memory import InMemoryRunsService


class Counted(int):
    """A sequence number counting the comparisons it takes part in."""

    compared = 0

    def __gt__(self, other: Any) -> bool:
        Counted.compared += 1
        return int(self) > int(other)

    def __lt__(self, other: Any) -> bool:
        Counted.compared += 1
        return int(self) < int(other)


async def test_a_read_after_a_position_does_not_go_through_the_events_before_it() -> None:
    # A follower of a long run reads after its position each time the run is written: a
    # read that went through every event of the run made following it quadratic, a few
    # followers of a run of 40,000 events taking the server's whole CPU for minutes.
    count = 20_000
    runs = InMemoryRunsService()
    async with runs:
        await runs.create_run(RunRecord(id="long", user_id="alice", session_id="s1"))
        await runs.append_events(
            "alice", "long", [(Counted(sequence), "{}") for sequence in range(count)]
        )
        Counted.compared = 0
        assert [sequence for sequence, _ in await runs.read_events("alice", "long", count - 3)] == [
            count - 2,
            count - 1,
        ]
        assert [s for s, _ in await runs.read_events("alice", "long", 9, limit=2)] == [10, 11]
        assert Counted.compared < 100
        assert len(await runs.read_events("alice", "long")) == count
        assert await runs.read_events("alice", "long", count - 1) == []
