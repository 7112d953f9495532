"""``ReActAgent``, scripted: no model; a name told to it is kept in its state. It uses its
memory as agentscope 1.0.21's agent does."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from agentscope.message import Msg


class ReActAgent:
    def __init__(
        self,
        name: str,
        sys_prompt: str,
        model: Any,
        formatter: Any,
        toolkit: Any = None,
        memory: Any = None,
        **kwargs: Any,
    ) -> None:
        self.name = name
        self.memory = memory
        self.toolkit = toolkit
        self.known_name: str | None = None
        self.turns = 0
        self.msg_queue: asyncio.Queue[Any] | None = None

    def set_console_output_enabled(self, enabled: bool) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"known_name": self.known_name, "turns": self.turns}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        self.known_name = state.get("known_name")
        self.turns = state.get("turns", 0)

    async def __call__(self, msgs: Any) -> Msg:
        msgs = msgs if isinstance(msgs, list) else [msgs]
        await self.memory.add(msgs)
        text = msgs[-1].get_text_content() or ""
        told = re.search(r"[Mm]y name is (\w+)", text)
        if told:
            self.known_name = told.group(1)
        self.turns += 1
        # Each reasoning step of agentscope 1.0.21's agent: the prompt is the memory, then
        # the hints given for the step (added with the "hint" mark) are deleted by it.
        await self.memory.get_memory(exclude_mark=None)
        await self.memory.delete_by_mark(mark="hint")
        remembered = await self.memory.size()
        if told:
            pieces = ["Nice to meet you, ", f"{self.known_name}!"]
        else:
            pieces = ["Your name is ", f"{self.known_name}. ", f"({remembered} messages so far)"]
        reply = Msg(self.name, "", "assistant")
        text_so_far = ""
        for i, piece in enumerate(pieces):
            text_so_far += piece
            reply.content = [{"type": "text", "text": text_so_far}]
            if self.msg_queue is not None:
                snapshot = Msg(self.name, list(reply.content), "assistant")
                snapshot.id = reply.id
                await self.msg_queue.put((snapshot, i == len(pieces) - 1))
        await self.memory.add(reply)
        return reply
