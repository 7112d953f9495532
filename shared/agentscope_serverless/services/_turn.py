"""What an agent stored itself during its turn, so the runner does not store it again.

The runner keeps each turn (its input and reply) in the session history and in memory. An
agent written for AgentScope Runtime, whose runner stores nothing, keeps its turn itself
(``AgentScopeSessionHistoryMemory.add``, ``memory_service.add_memory``): while its handler
runs, :func:`agent_turn` notes such writes, and the runner leaves what the agent stored
alone instead of storing the turn twice.

>>> with agent_turn(AgentWrites("alice", "s1")) as writes:
...     note_history_write("alice", "s1")
>>> writes.history, writes.memory
(True, False)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar, Token
from dataclasses import dataclass


@dataclass
class AgentWrites:
    """Whether the agent of a turn wrote its session's history, or its user's memory."""

    user_id: str
    session_id: str
    history: bool = False
    memory: bool = False


_CURRENT: ContextVar[AgentWrites | None] = ContextVar("agent_turn_writes", default=None)


@contextlib.contextmanager
def agent_turn(writes: AgentWrites) -> Iterator[AgentWrites]:
    """Note in ``writes`` the writes made in this context (the agent's handler runs in it)
    to its user's session and memory."""
    previous = _CURRENT.set(writes).old_value
    try:
        yield writes
    finally:
        # Not reset(): a generator running this may be closed from another context.
        _CURRENT.set(None if previous is Token.MISSING else previous)


@contextlib.contextmanager
def acting_for(user_id: str) -> Iterator[None]:
    """Work done in this context outside an agent's turn (a background task) is done for
    ``user_id``, as a turn's is for its user (see :func:`turn_user_id`)."""
    # No session is blank: nothing is taken for a write to one of the turn's.
    with agent_turn(AgentWrites(user_id, "")):
        yield


def turn_user_id() -> str | None:
    """The user whose turn the agent is running, or whose background task runs (None
    outside both): what is done for them (a remote agent called, a sandbox connected) is
    done as that user."""
    writes = _CURRENT.get()
    return writes.user_id if writes is not None else None


def note_history_write(user_id: str, session_id: str) -> None:
    """A message was appended to ``session_id`` of ``user_id``."""
    writes = _CURRENT.get()
    if writes is not None and (writes.user_id, writes.session_id) == (user_id, session_id):
        writes.history = True


def note_memory_write(user_id: str) -> None:
    """A memory was added for ``user_id``."""
    writes = _CURRENT.get()
    if writes is not None and writes.user_id == user_id:
        writes.memory = True


# Whether the next run started in this context repeats an earlier request (taken once).
_REPEATED: ContextVar[list[bool] | None] = ContextVar("repeated_request", default=None)


def repeats_earlier_request() -> None:
    """Tell the next run started in the current context that it repeats an earlier request
    (a retry after a run that may have stored its input): every id of its input is looked
    up in the session, not only those its sender gave, and the messages found are not added
    to memory again. Runs started after it, inside it or in the same context, do not."""
    _REPEATED.set([True])


def take_repeated() -> bool:
    """Whether the run starting now repeats an earlier request (see
    :func:`repeats_earlier_request`); asked once."""
    repeated = _REPEATED.get()
    return repeated.pop() if repeated else False


__all__ = [
    "AgentWrites",
    "acting_for",
    "agent_turn",
    "note_history_write",
    "note_memory_write",
    "repeats_earlier_request",
    "take_repeated",
    "turn_user_id",
]
