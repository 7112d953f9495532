"""AgentScope's A2A configuration of an app: :class:`AgentCardWithRuntimeConfig`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.not_offered import missing_name
from agentscope_serverless.settings import environment_port

DEFAULT_WELLKNOWN_PATH = "/.well-known/agent-card.json"
# The fields of a configured card the served card takes.
_CARD_FIELDS = ("name", "description", "version", "skills")


class AgentCardWithRuntimeConfig(BaseModel):
    """An agent card's fields with the runtime settings of its A2A server."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")

    agent_card: Any = None
    host: str | None = None
    port: int = Field(default_factory=environment_port)
    registry: list[Any] | None = None
    task_timeout: int | None = 60
    task_event_timeout: int | None = 10
    wellknown_path: str | None = DEFAULT_WELLKNOWN_PATH

    @field_validator("registry", mode="before")
    @classmethod
    def _as_list(cls, registry: Any) -> Any:
        if registry is None or isinstance(registry, list):
            return registry
        return [registry]

    @field_validator("agent_card")
    @classmethod
    def _a_card(cls, card: Any) -> Any:
        if card is not None and not isinstance(card, dict) and not hasattr(card, "DESCRIPTOR"):
            raise ValueError("agent_card must be a dict or an a2a-sdk AgentCard")
        return card

    @field_validator("wellknown_path")
    @classmethod
    def _a_path(cls, path: str | None) -> str | None:
        if path is not None and not path.startswith("/"):
            raise ValueError(f"wellknown_path must start with '/', got {path!r}")
        return path

    def card_fields(self) -> dict[str, Any]:
        """The fields of the configured card the served card takes (skills as dicts)."""
        card = self.agent_card
        if card is None:
            return {}
        if not isinstance(card, dict):
            from google.protobuf.json_format import MessageToDict

            card = MessageToDict(card, preserving_proto_field_name=True)
        fields = {name: card[name] for name in _CARD_FIELDS if card.get(name)}
        if "skills" in fields:
            fields["skills"] = [_as_dict(skill) for skill in fields["skills"]]
        return fields


def _as_dict(skill: Any) -> Any:
    if hasattr(skill, "DESCRIPTOR"):  # an a2a-sdk AgentSkill
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(skill, preserving_proto_field_name=True)
    return skill


def extract_a2a_config(
    a2a_config: AgentCardWithRuntimeConfig | dict[str, Any] | None = None,
) -> AgentCardWithRuntimeConfig:
    """``a2a_config`` as an :class:`AgentCardWithRuntimeConfig` (a default one for None);
    one naming a registry is refused (:class:`~agentscope_serverless.errors.ConfigurationError`)."""
    if a2a_config is None:
        config = AgentCardWithRuntimeConfig()
    elif isinstance(a2a_config, AgentCardWithRuntimeConfig):
        config = a2a_config
    elif isinstance(a2a_config, dict):
        config = AgentCardWithRuntimeConfig.model_validate(a2a_config)
    else:
        raise TypeError("a2a_config must be an AgentCardWithRuntimeConfig or a dict")
    if config.registry:
        raise ConfigurationError(
            "A2A registries (a2a_config.registry) are not supported: the agent is reached at "
            "its own URL, whose card is at /.well-known/agent-card.json"
        )
    return config


def __getattr__(name: str) -> Any:
    raise missing_name(__name__, name)


__all__ = ["AgentCardWithRuntimeConfig", "extract_a2a_config"]
