"""Services written for AgentScope Runtime: subclasses implementing its public methods.

AgentScope's service base classes left the public methods abstract (``create_session``,
``add_memory``, ``save_state``...), so a custom backend written for it overrides those; ours
implement them once, over ``_``-prefixed hooks each backend provides. A subclass that
overrides every abstract public method of AgentScope's base is such a backend: the hooks it
leaves abstract are implemented here with its public methods (what the runner and the
routes need beyond AgentScope's methods, such as ``open_session`` or a page of messages, is
read through them), and it checks its own state (the base's started check, which its
``start()`` may not set, is left out). What AgentScope's methods cannot give (listing a
session's state rounds, clearing every user's memory...) raises
:class:`~agentscope_serverless.errors.MethodNotImplementedError` (a ``NotImplementedError``,
answered over HTTP as a 501) saying which method to override. Its ``super()`` calls of
AgentScope's methods do nothing, as AgentScope's base did (see :func:`agentscope_base_method`).

A subclass of one of our backends (a wrapper overriding the public methods to call
``super()``) is not such a backend: it has the hooks already, and keeps the started check.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

from agentscope_serverless.errors import InvalidInputError, MethodNotImplementedError
from agentscope_serverless.schemas.agent_schemas import Message, Role, TextContent
from agentscope_serverless.schemas.pagination import Page
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services._validation import to_messages

Hook = Callable[..., Any]
# The attribute marking the hooks made here.
_MADE_HERE = "__ported_hook__"


def adapt_ported_subclass(
    cls: type,
    base: type,
    agentscope_methods: tuple[str, ...],
    hooks: Mapping[str, Hook],
) -> None:
    """Implement the ``hooks`` that ``cls`` leaves abstract when it overrides every one of
    ``agentscope_methods`` of ``base`` (see the module's documentation).

    A subclass of a backend (whose hooks are all implemented: a wrapper overriding the
    public methods to call ``super()``) is not adapted: it keeps the backend's storage and
    its started check.
    """
    ported = all(
        getattr(cls, name) is not getattr(base, name) for name in agentscope_methods
    ) and any(_left_to_adapt(getattr(cls, name)) for name in hooks)
    setattr(cls, _PORTED, ported)
    if not ported:
        return
    for name, hook in hooks.items():
        # Abstract, or made here for a parent class (this class may override otherwise).
        if _left_to_adapt(getattr(cls, name)):
            method = _CALLS.get(name)
            if method is not None and getattr(cls, method) is getattr(base, method):
                # The base's method would call this hook back: it is not the subclass's.
                hook = unsupported(method, _CALLS_WHAT[method])
            setattr(cls, name, hook)
    cls._ensure_started = _checked_by_the_subclass  # type: ignore[attr-defined]


# The attribute telling whether a class is adapted here.
_PORTED = "__ported_backend__"


def _left_to_adapt(hook: Any) -> bool:
    """Whether ``hook`` is abstract, or made here for a parent class."""
    return getattr(hook, "__isabstractmethod__", False) or hasattr(hook, _MADE_HERE)


AgentScopeMethod = TypeVar("AgentScopeMethod", bound=Callable[..., Awaitable[Any]])


def agentscope_base_method(method: AgentScopeMethod) -> AgentScopeMethod:
    """``method``, one of AgentScope's base methods, which does nothing (returns None) when
    a ported subclass overriding it calls it with ``super()``, as AgentScope's base did.

    The base's method would call the subclass's back through a hook made here, again and
    again; AgentScope's did nothing (``append_message`` was a no-op, the others abstract).
    """
    name = method.__name__

    @functools.wraps(method)
    async def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(type(self), _PORTED, False) and getattr(type(self), name) is not checked:
            return None
        return await method(self, *args, **kwargs)

    return cast(AgentScopeMethod, checked)


# Hooks made of a public method that AgentScope's base did not make abstract: the subclass
# may not override it, and what it would do is then not there.
_CALLS = {"_append_messages": "append_message"}
_CALLS_WHAT = {"append_message": "store a session's messages"}


def _checked_by_the_subclass(self: Any) -> None:
    """A ported subclass checks its own state in its own methods."""


def unsupported(method: str, what: str) -> Hook:
    """A hook a ported subclass cannot provide with AgentScope's methods."""

    async def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise MethodNotImplementedError(
            f"{type(self).__name__} implements AgentScope Runtime's methods only: "
            f"override {method}() to {what}"
        )

    return made_here(hook)


def made_here(hook: Hook) -> Hook:
    """``hook``, marked as one of the hooks made here."""
    setattr(hook, _MADE_HERE, True)
    return hook


def offset_of(cursor: str | None) -> int:
    """The position a cursor of :func:`page_of` names (0 for none)."""
    if cursor is None:
        return 0
    if not (cursor.isascii() and cursor.isdigit()):
        raise InvalidInputError("cursor is not valid", field="cursor")
    return int(cursor)


def page_of(items: list[Any], limit: int, cursor: str | None) -> Page[Any]:
    """The page of ``items`` at ``cursor`` (a position in the list)."""
    start = offset_of(cursor)
    end = start + limit
    return Page(items=items[start:end], next_cursor=str(end) if end < len(items) else None)


# Session history -------------------------------------------------------------------------


async def _create_session(self: Any, user_id: str, session_id: str) -> Session:
    return _with_messages(await self.create_session(user_id, session_id))


async def _open_session(self: Any, user_id: str, session_id: str, recent: int) -> Session:
    session = await self.get_session(user_id, session_id)
    if session is None:
        session = await self.create_session(user_id, session_id)
    session = _with_messages(session)
    session.messages = session.messages[-recent:] if recent else []
    return session


async def _get_session(self: Any, user_id: str, session_id: str) -> Session | None:
    session = await self.get_session(user_id, session_id)
    return None if session is None else _with_messages(session)


async def _delete_session(self: Any, user_id: str, session_id: str) -> None:
    await self.delete_session(user_id, session_id)


async def _list_sessions_page(
    self: Any, user_id: str, limit: int, cursor: str | None
) -> Page[Session]:
    sessions = [Session(id=s.id, user_id=s.user_id) for s in await self.list_sessions(user_id)]
    return page_of(sessions, limit, cursor)


async def _list_messages(
    self: Any, user_id: str, session_id: str, limit: int, cursor: str | None
) -> Page[Message] | None:
    session = await self.get_session(user_id, session_id)
    return None if session is None else page_of(_with_messages(session).messages, limit, cursor)


async def _append_messages(
    self: Any, user_id: str, session_id: str, messages: list[Message]
) -> list[Message]:
    await self.append_message(Session(id=session_id, user_id=user_id), messages)
    return messages


async def _delete_user_sessions(self: Any, user_id: str) -> None:
    for session in await self.list_sessions(user_id):
        await self.delete_session(user_id, session.id)


def _with_messages(session: Session) -> Session:
    """``session`` with its messages validated (a ported backend may keep dicts)."""
    return Session(
        id=session.id, user_id=session.user_id, messages=to_messages(session.messages, stored=True)
    )


SESSION_HISTORY_METHODS = ("create_session", "get_session", "delete_session", "list_sessions")
SESSION_HISTORY_HOOKS: dict[str, Hook] = {
    "_create_session": made_here(_create_session),
    "_open_session": made_here(_open_session),
    "_get_session": made_here(_get_session),
    "_delete_session": made_here(_delete_session),
    "_list_sessions_page": made_here(_list_sessions_page),
    "_list_messages": made_here(_list_messages),
    "_append_messages": made_here(_append_messages),
    "_delete_user_sessions": made_here(_delete_user_sessions),
}

# Long-term memory ------------------------------------------------------------------------


async def _search(self: Any, user_id: str, terms: list[str], top_k: int) -> list[Message]:
    query = Message(role=Role.USER, content=[TextContent(text=" ".join(terms))])
    return to_messages(await self.search_memory(user_id, [query], {"top_k": top_k}), stored=True)


async def _list(self: Any, user_id: str, offset: int, limit: int) -> list[Message]:
    listed = await self.list_memory(user_id, {"page_num": 1, "page_size": offset + limit})
    return to_messages(listed, stored=True)[offset:]


async def _delete(self: Any, user_id: str, session_id: str | None) -> None:
    await self.delete_memory(user_id, session_id)


MEMORY_METHODS = ("add_memory", "search_memory", "list_memory", "delete_memory")
MEMORY_HOOKS: dict[str, Hook] = {
    "_add": unsupported("add_memory", "add memories"),
    "_search": made_here(_search),
    "_list": made_here(_list),
    "_delete": made_here(_delete),
    "_clear_all": unsupported("clear_all_memory", "forget every user's memories"),
}

# Agent state -----------------------------------------------------------------------------


async def _save_next(
    self: Any, user_id: str, session_id: str, state: dict[str, Any], write_id: str | None
) -> int:
    return int(await self.save_state(user_id, state, session_id=session_id))


async def _save_round(
    self: Any, user_id: str, session_id: str, round_id: int, state: dict[str, Any]
) -> None:
    await self.save_state(user_id, state, session_id=session_id, round_id=round_id)


async def _load(
    self: Any, user_id: str, session_id: str, round_id: int | None
) -> tuple[int | None, dict[str, Any]] | None:
    # The latest (round_id None) is read as AgentScope read it: its export_state() gives
    # the state, not which round it is.
    state = await self.export_state(user_id, session_id=session_id, round_id=round_id)
    return None if state is None else (round_id, state)


STATE_METHODS = ("save_state", "export_state")
STATE_HOOKS: dict[str, Hook] = {
    "_save_next": made_here(_save_next),
    "_save_round": made_here(_save_round),
    "_load": made_here(_load),
    "_list_rounds": unsupported("list_rounds", "list a session's rounds"),
    "_delete": unsupported("delete_state", "delete a session's state"),
    "_delete_user_state": unsupported("delete_user_state", "delete a user's state"),
}
