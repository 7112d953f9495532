"""An AgentScope long-term memory kept in a memory service.

>>> long_term_memory = AgentScopeLongTermMemory(
...     service=memory_service, user_id="alice", session_id="s1"
... )
>>> agent = ReActAgent(..., long_term_memory=long_term_memory)

What the agent records is added to the user's memory (under the session); what it retrieves
is searched in the user's whole memory, each query giving its best ``limit`` memories, one
memory's text a line. The agent's tools ``record_to_memory`` and ``retrieve_from_memory``
answer with a ``ToolResponse`` saying what happened, as AgentScope Runtime's adapter's do.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentscope_serverless.adapters.agentscope import agentscope_missing

try:
    from agentscope.memory import LongTermMemoryBase  # type: ignore[import-not-found]
    from agentscope.message import Msg, TextBlock, ThinkingBlock  # type: ignore[import-not-found]
    from agentscope.tool import ToolResponse  # type: ignore[import-not-found]
except ModuleNotFoundError as exc:
    raise agentscope_missing(__name__, exc) from None

from agentscope_serverless.adapters.agentscope.message import agentscope_msg_to_message
from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.services.memory.base import MemoryService


class AgentScopeLongTermMemory(LongTermMemoryBase):  # type: ignore[misc]
    """The memory of ``user_id`` in ``service``, as an AgentScope long-term memory;
    what is recorded goes under ``session_id``."""

    def __init__(self, service: MemoryService, user_id: str, session_id: str) -> None:
        super().__init__()
        self._service = service
        self.user_id = user_id
        self.session_id = session_id

    async def record(self, msgs: list[Any], **kwargs: Any) -> None:
        """Add ``msgs`` (AgentScope ``Msg``\\ s, or one; None entries are skipped) to the
        memory."""
        given: object = msgs
        listed = [given] if isinstance(given, Msg) else list(msgs or [])
        kept = [msg for msg in listed if msg is not None]
        others = [msg for msg in kept if not isinstance(msg, Msg)]  # a text's characters too
        if others:
            kind = type(others[0]).__name__
            raise TypeError(f"msgs must be AgentScope Msg objects (or a list of them), got {kind}")
        if not kept:
            return
        await self._service.add_memory(
            self.user_id, agentscope_msg_to_message(kept), session_id=self.session_id
        )

    async def retrieve(self, msg: Any, limit: int = 5, **kwargs: Any) -> str:
        """The memories matching ``msg`` (a ``Msg`` or a list: ``limit`` for each), one
        memory's text a line; a search that failed gives ``Error: ...`` in its place."""
        if not msg:
            msg = [
                Msg(name="assistant", content=[TextBlock(type="text", text="")], role="assistant")
            ]
        queries = [msg] if isinstance(msg, Msg) else list(msg)
        others = [query for query in queries if not isinstance(query, Msg)]
        if others:  # a text's characters too
            kind = type(others[0]).__name__
            raise TypeError(f"msg must be an AgentScope Msg (or a list of them), got {kind}")
        results = await asyncio.gather(
            *(
                self._service.search_memory(
                    self.user_id, [agentscope_msg_to_message(query)], filters={"top_k": limit}
                )
                for query in queries
            ),
            return_exceptions=True,
        )
        return "\n".join(
            f"Error: {result}"
            if isinstance(result, BaseException)
            else "\n".join(_text_of(memory) for memory in result)
            for result in results
        )

    async def record_to_memory(self, thinking: str, content: list[str], **kwargs: Any) -> Any:
        """Use this function to record important information that you may need later. The
        target content should be specific and concise, e.g. who, when, where, do what, why,
        how, etc.

        Args:
            thinking (`str`):
                Your thinking and reasoning about what to record
            content (`list[str]`):
                The content to remember, which is a list of strings.
        """
        given: object = content  # a model may send its text for a list of one
        texts = [given] if isinstance(given, str) else content
        blocks = [ThinkingBlock(type="thinking", thinking=thinking)]
        blocks += [TextBlock(type="text", text=text) for text in texts]
        try:
            await self.record([Msg(name="assistant", content=blocks, role="assistant")])
        except Exception as exc:
            return _response(f"Error recording content to memory: {exc}")
        return _response("Successfully recorded content to memory")

    async def retrieve_from_memory(self, keywords: list[str], limit: int = 5, **kwargs: Any) -> Any:
        """Retrieve the memory based on the given keywords.

        Args:
            keywords (`list[str]`):
                Concise search cues, such as a person's name, a specific date, a location, or
                a short description of the memory you want to retrieve. Each keyword is
                executed as an independent query against the memory store.
            limit (`int`, optional):
                The maximum number of memories to retrieve per search, i.e., the number of
                memories to retrieve for each keyword.
        """
        given: object = keywords  # a model may send its text for a list of one
        words = [given] if isinstance(given, str) else keywords
        queries = [
            Msg(name="assistant", content=[TextBlock(type="text", text=word)], role="assistant")
            for word in words
        ]
        try:
            found = await self.retrieve(queries, limit=limit, **kwargs)
        except Exception as exc:
            return _response(f"Error retrieving memory: {exc}")
        return _response(found)


def _text_of(memory: Message) -> str:
    return "".join(
        str(getattr(part, "text", "") or "") for part in memory.content or [] if part.type == "text"
    )


def _response(text: str) -> Any:
    return ToolResponse(content=[TextBlock(type="text", text=text)])


__all__ = ["AgentScopeLongTermMemory"]
