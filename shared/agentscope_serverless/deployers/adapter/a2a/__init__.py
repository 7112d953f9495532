"""AgentScope's A2A configuration: ``AgentApp(a2a_config=AgentCardWithRuntimeConfig(...))``.

Every app serves A2A (see :mod:`agentscope_serverless.http.routers.a2a`); the configuration
names what its agent card says: ``agent_card`` (a dict, or the ``a2a-sdk``'s ``AgentCard``)
gives the card's ``name``, ``description``, ``version`` and ``skills`` (the app's name and
description otherwise), and ``wellknown_path`` a path the card is also served at. Service
registries (``registry``: Nacos...) are not supported: an app naming one is refused, rather
than started unregistered. ``host``, ``port`` and the task timeouts are AgentScope's server's;
the card's URLs are the ones the card was requested at, or ``A2A_BASE_URL``.

>>> config = extract_a2a_config({"agent_card": {"name": "Friday", "version": "2.0"}})
>>> config.card_fields()
{'name': 'Friday', 'version': '2.0'}
"""

from typing import Any

from agentscope_serverless.deployers.adapter.a2a.a2a_protocol_adapter import (
    AgentCardWithRuntimeConfig,
    extract_a2a_config,
)
from agentscope_serverless.deployers.adapter.a2a.a2a_registry import A2ARegistry
from agentscope_serverless.not_offered import missing_name


def __getattr__(name: str) -> Any:
    raise missing_name(__name__, name)


__all__ = ["A2ARegistry", "AgentCardWithRuntimeConfig", "extract_a2a_config"]
