"""Another A2A agent as a tool: ``a2a_agent_tool(url, api_key=...)`` gives an
:class:`~agentscope_serverless.agents.tools.AgentTool` that sends the model's ``message`` to
that agent with the ``a2a-sdk`` client and returns the agent's reply text::

    from agentscope_serverless.agents.a2a_tool import a2a_agent_tool
    from agentscope_serverless.agents.llm import create_llm_app

    helper = await a2a_agent_tool("https://helper.example.com", api_key=KEY)
    app = create_llm_app(tools=[helper])

The tool's name and description come from the remote agent's card (fetched once, with the
key as a bearer token); :func:`ask_a2a_agent` is the same call without the tool wrapper.

Called in a run, the tool acts there for the run's user (``X-User-Id``): the remote agent
keeps each user's sessions and memory apart, as it does for its own users, rather than
holding everyone's under the key's user. So give it a service key of the remote agent; a
user key acts only as its own user, and the tool's calls in other users' runs are refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import get_artifact_text, get_message_text, new_text_message
from a2a.types import AgentCard, Role, SendMessageRequest, TaskState

from agentscope_serverless.agents.tools import AgentTool
from agentscope_serverless.errors import AgentError
from agentscope_serverless.services._turn import turn_user_id
from agentscope_serverless.unpacking import unpacking

# The largest answer of the other agent read (a card, a reply with its task), unpacked.
MAX_ANSWER_BYTES = 64 * 1024**2

_PARAMETERS = {
    "type": "object",
    "properties": {"message": {"type": "string", "description": "What to ask the agent."}},
    "required": ["message"],
}


def _headers(api_key: str | None, user_id: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if user_id is not None:
        headers["X-User-Id"] = user_id
    return headers


def _hooks() -> dict[str, list[Callable[[Any], Any]]]:
    """The other agent's answers (read whole by the A2A client) up to MAX_ANSWER_BYTES,
    unpacked a bounded piece at a time; a refusal to act for the user named."""
    hooks = unpacking(max_bytes=MAX_ANSWER_BYTES)
    hooks["response"].append(_refused)
    return hooks


async def _refused(response: httpx.Response) -> None:
    if response.status_code == 403:
        raise AgentError(
            "the agent refused to act for this user: its key acts only as its own user "
            "(give the tool a service key of the agent, which acts for each user)"
        )


async def fetch_card(
    url: str, *, api_key: str | None = None, timeout_seconds: float = 30
) -> AgentCard:
    """The agent card of the A2A agent at ``url``."""
    async with httpx.AsyncClient(
        headers=_headers(api_key),
        timeout=timeout_seconds,
        event_hooks=unpacking(max_bytes=MAX_ANSWER_BYTES),
    ) as http:
        return await A2ACardResolver(http, url).get_agent_card()


async def ask_a2a_agent(
    card: AgentCard,
    message: str,
    *,
    api_key: str | None = None,
    context_id: str | None = None,
    timeout_seconds: float = 120,
    user_id: str | None = None,
) -> str:
    """Send ``message`` to the agent of ``card`` and return its reply text; with
    ``user_id``, as that user (``X-User-Id``, for a service key of the agent)."""
    async with httpx.AsyncClient(
        headers=_headers(api_key, user_id),
        timeout=timeout_seconds,
        event_hooks=_hooks(),
    ) as http:
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        request = SendMessageRequest(
            message=new_text_message(message, context_id=context_id, role=Role.ROLE_USER)
        )
        async for response in client.send_message(request):
            if response.HasField("message"):
                return str(get_message_text(response.message, delimiter=""))
            task = response.task
            if task.status.state != TaskState.TASK_STATE_COMPLETED:
                # Its state, and what it said of it (a failed task's error), for the model.
                state = TaskState.Name(task.status.state).removeprefix("TASK_STATE_").lower()
                said = get_message_text(task.status.message, delimiter="")
                raise AgentError(
                    f"the agent {card.name!r} did not complete the task "
                    f"({state}{': ' + said if said else ''})"
                )
            return "".join(str(get_artifact_text(a, delimiter="")) for a in task.artifacts)
    raise AgentError(f"the agent {card.name!r} sent no reply")


async def a2a_agent_tool(
    url: str, *, api_key: str | None = None, name: str | None = None, timeout_seconds: float = 120
) -> AgentTool:
    """The A2A agent at ``url`` as a tool taking one argument, ``message``, that acts for
    the user of the run calling it (see the module)."""
    card = await fetch_card(url, api_key=api_key)
    tool_name = name or re.sub(r"[^A-Za-z0-9_-]", "_", card.name)[:64] or "a2a_agent"

    async def call(arguments: dict[str, Any]) -> str:
        return await ask_a2a_agent(
            card,
            str(arguments.get("message", "")),
            api_key=api_key,
            timeout_seconds=timeout_seconds,
            user_id=turn_user_id(),
        )

    return AgentTool(
        name=tool_name,
        description=card.description or f"Ask the agent {card.name}.",
        parameters=_PARAMETERS,
        call=call,
    )


__all__ = ["a2a_agent_tool", "ask_a2a_agent", "fetch_card"]
