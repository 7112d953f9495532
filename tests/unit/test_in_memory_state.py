"""The in-memory state service keeps nothing of a user whose state is all deleted."""

from __future__ import annotations

import asyncio

from agentscope_serverless.services._once import seed_writes
from agentscope_serverless.services.agent_state.in_memory import InMemoryStateService


def held(service: InMemoryStateService) -> dict[str, object]:
    """What the service's dicts hold (each of its attributes that is one)."""
    return {
        name: value for name, value in vars(service).items() if isinstance(value, dict) and value
    }


async def test_a_user_whose_state_is_all_deleted_leaves_nothing_behind() -> None:
    # Each user who saved then deleted their state left an entry behind, for ever: a warm
    # process serving many users grew by one per user.
    async with InMemoryStateService() as state:
        for number in range(20):
            user = f"user-{number}"
            await state.save_state(user, {"v": 1}, session_id="s1")

            async def keyed(user: str = user) -> None:  # a save under an Idempotency-Key
                seed_writes(f"{user}\0key")
                await state.save_state(user, {"v": 2}, session_id="s2")

            await asyncio.create_task(keyed())
            await state.delete_state(user, session_id="s1")
            assert held(state)  # s2 is still there
            await state.delete_state(user, session_id="s2")
        assert held(state) == {}


async def test_a_keyed_save_is_still_applied_once_while_its_session_lasts() -> None:
    async with InMemoryStateService() as state:

        async def keyed() -> int:
            seed_writes("u1\0key")
            return await state.save_state("u1", {"v": 1}, session_id="s1")

        assert await asyncio.create_task(keyed()) == 1
        assert await asyncio.create_task(keyed()) == 1
        assert await state.list_rounds("u1", session_id="s1") == [1]
        await state.delete_state("u1", session_id="s1")
        assert await asyncio.create_task(keyed()) == 1  # a new session's first round
        assert held(state)
