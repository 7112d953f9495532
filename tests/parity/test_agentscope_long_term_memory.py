"""``AgentScopeLongTermMemory`` as AgentScope Runtime 1.0.5's (``agentscope_runtime.adapters.
agentscope.long_term_memory``): an agent's long-term memory kept in a memory service (Redis
here), recorded under the session and retrieved from the user's whole memory, with the
agent's ``record_to_memory`` and ``retrieve_from_memory`` tools. With the AgentScope-shaped
package (``agentscope_standin/``), in a child process."""

from __future__ import annotations

import uuid

from agentscope_serverless.local_stack import RedisServer
from tests.parity.test_agentscope_query import run_script

SCRIPT = """
import asyncio
from agentscope.message import Msg
from agentscope_serverless.adapters.agentscope.long_term_memory import (
    AgentScopeLongTermMemory,
)
from agentscope_serverless.services.memory import RedisMemoryService

async def main():
    async with RedisMemoryService(redis_url=REDIS_URL) as service:
        memory = AgentScopeLongTermMemory(service=service, user_id=USER, session_id="s1")
        await memory.record([Msg("alice", "I love green tea", "user"), None])
        other = AgentScopeLongTermMemory(service=service, user_id=USER, session_id="s2")
        print(repr(await other.retrieve(Msg("alice", "Which tea?", "user"))))
        saved = await memory.record_to_memory("worth keeping", ["Alice lives in Lyon"])
        print(saved.content[0]["text"])
        found = await other.retrieve_from_memory(["Lyon", "tea"], limit=1)
        print(repr(found.content[0]["text"]))
        listed = await service.list_memory(USER)
        print([(m.role, m.get_text_content()) for m in listed])

asyncio.run(main())
"""


def test_an_agents_long_term_memory_records_and_retrieves_in_the_memory_service(
    redis_server: RedisServer,
) -> None:
    user = f"user-{uuid.uuid4().hex[:12]}"
    script = f"REDIS_URL = {redis_server.url!r}\nUSER = {user!r}\n{SCRIPT}"
    assert run_script(script).splitlines() == [
        "'I love green tea'",
        "Successfully recorded content to memory",
        "'Alice lives in Lyon\\nI love green tea'",
        "[('user', 'I love green tea'), ('assistant', 'Alice lives in Lyon')]",
    ]


TEXT_FOR_A_LIST = """
import asyncio
from agentscope_serverless.adapters.agentscope.long_term_memory import (
    AgentScopeLongTermMemory,
)
from agentscope_serverless.services.memory import InMemoryMemoryService

async def main():
    async with InMemoryMemoryService() as service:
        memory = AgentScopeLongTermMemory(service=service, user_id="u1", session_id="s1")
        await memory.record_to_memory("worth keeping", "Alice lives in Lyon")
        await service.add_memory("u1", [{"role": "user", "content": "Bob likes tea"}])
        print([m.get_text_content() for m in await service.list_memory("u1")])
        found = await memory.retrieve_from_memory("Lyon")
        print(repr(found.content[0]["text"]))

asyncio.run(main())
"""


def test_the_memory_tools_take_a_text_for_a_list_of_one() -> None:
    # A model passing the text itself, not a list: it was recorded one block per character,
    # and searched for letter by letter ("t" finding every memory holding one).
    assert run_script(TEXT_FOR_A_LIST).splitlines() == [
        "['Alice lives in Lyon', 'Bob likes tea']",
        "'Alice lives in Lyon'",
    ]


ONE_MSG = """
import asyncio
from agentscope.message import Msg
from agentscope_serverless.adapters.agentscope.long_term_memory import (
    AgentScopeLongTermMemory,
)
from agentscope_serverless.services.memory import InMemoryMemoryService

async def main():
    async with InMemoryMemoryService() as service:
        memory = AgentScopeLongTermMemory(service=service, user_id="u1", session_id="s1")
        await memory.record(Msg("alice", "I love green tea", "user"))
        print([m.get_text_content() for m in await service.list_memory("u1")])
        for given in ("I love tea", [{"role": "user", "content": "tea"}]):
            try:
                await memory.record(given)
            except TypeError as exc:
                print(exc)
        try:
            await memory.retrieve("tea")
        except TypeError as exc:
            print(exc)

asyncio.run(main())
"""


def test_record_takes_one_msg_and_both_refuse_what_is_no_msg() -> None:
    # One Msg failed with "'Msg' object is not iterable"; a text with "'str' object has no
    # attribute 'role'".
    assert run_script(ONE_MSG).splitlines() == [
        "['I love green tea']",
        "msgs must be AgentScope Msg objects (or a list of them), got str",
        "msgs must be AgentScope Msg objects (or a list of them), got dict",
        "msg must be an AgentScope Msg (or a list of them), got str",
    ]
