"""One settings object, read from environment variables and validated once at start-up.

Every setting is an environment variable of the same name in upper case, for example
``SESSION_HISTORY_BACKEND=redis``. A bad value fails at start-up with the variable's name
and what is wrong with it (never its value, which may be a secret).

>>> Settings(session_history_backend="in_memory").memory_backend
'in_memory'
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentscope_serverless.errors import ConfigurationError

SessionHistoryBackend = Literal["in_memory", "redis", "dynamodb"]
MemoryBackend = Literal["in_memory", "redis"]
StateBackend = Literal["in_memory", "redis", "dynamodb"]
KeyStoreBackend = Literal["in_memory", "file", "dynamodb"]
AuthMode = Literal["keys", "iam"]


class Settings(BaseSettings):
    """Every setting of the project, with its environment variable and default."""

    model_config = SettingsConfigDict(
        env_prefix="",
        case_sensitive=False,
        extra="ignore",
        env_ignore_empty=True,
        frozen=True,
    )

    session_history_backend: SessionHistoryBackend = Field(
        "in_memory", description="Where session history lives: in_memory, redis or dynamodb."
    )
    memory_backend: MemoryBackend = Field(
        "in_memory", description="Where long-term memory lives: in_memory or redis."
    )
    state_backend: StateBackend = Field(
        "in_memory", description="Where agent state lives: in_memory, redis or dynamodb."
    )

    redis_url: SecretStr = Field(
        SecretStr("redis://127.0.0.1:6379/0"),
        description="Redis URL (redis:// or rediss:// for TLS; may carry credentials).",
    )
    redis_password: SecretStr | None = Field(
        None, description="Redis password, when it is not in REDIS_URL."
    )
    redis_cluster: bool = Field(
        False, description="Talk to Redis in cluster mode (managed Redis / Valkey serverless)."
    )
    redis_key_prefix: str = Field(
        "agentscope",
        pattern=r"^[^{}\s]+$",
        max_length=64,
        description="Prefix of every Redis key (no braces or spaces).",
    )
    session_ttl_seconds: int | None = Field(
        None, ge=1, description="Sliding expiry of sessions in Redis/DynamoDB; unset: none."
    )
    memory_ttl_seconds: int | None = Field(
        None, ge=1, description="Expiry of long-term memory; unset: memory never expires."
    )
    state_ttl_seconds: int | None = Field(
        None, ge=1, description="Sliding expiry of agent state; unset: none."
    )
    max_messages_per_session: int | None = Field(
        None, ge=1, description="Keep only the newest N messages of a session; unset: all."
    )

    dynamodb_sessions_table: str = Field(
        "agentscope-sessions", min_length=3, description="DynamoDB table for session history."
    )
    dynamodb_state_table: str = Field(
        "agentscope-state", min_length=3, description="DynamoDB table for agent state."
    )
    dynamodb_endpoint_url: str | None = Field(
        None, description="DynamoDB endpoint (for a local emulator); unset: AWS."
    )
    aws_region: str = Field("us-east-1", description="AWS region of the DynamoDB tables.")
    secrets_arn: str | None = Field(
        None,
        description=(
            "Secrets Manager secret (a JSON object) whose non-empty llm_api_key, "
            "sandbox_bearer_token and redis_url fill those settings at the first request."
        ),
    )
    secrets_endpoint_url: str | None = Field(
        None, description="Secrets Manager endpoint (for a local emulator); unset: AWS."
    )

    sandbox_base_url: str | None = Field(
        None, description="Remote sandbox server URL; unset: an embedded local sandbox."
    )
    sandbox_bearer_token: SecretStr | None = Field(
        None, description="Bearer token of the remote sandbox server."
    )
    sandbox_timeout_seconds: float = Field(
        90.0, gt=0, description="Time limit of one request to the sandbox server, in seconds."
    )
    sandbox_max_per_user: int = Field(
        4, ge=1, le=1024, description="Sandboxes one user may hold at once (their share)."
    )
    sandbox_weaker_isolation: bool = Field(
        False,
        description="Let the embedded sandbox server run where the kernel cannot enforce "
        "its totals (no root, no cgroups or loop devices).",
    )

    agent_app: str = Field(
        "agentscope_serverless.agents.demo:app",
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description="The AgentApp the process endpoints serve, as an import path module:attribute.",
    )
    agent_memory_top_k: int = Field(
        5, ge=1, le=1000, description="How many long-term memories a run hands to the agent."
    )
    agent_history_window: int = Field(
        100,
        ge=0,
        le=1000,
        description=(
            "How many of the session's last messages a run hands to the agent (read with one"
            " bounded query; older ones are paged through list_messages)."
        ),
    )
    auth_mode: AuthMode = Field(
        "keys",
        description=(
            "keys: callers send a bearer API key. iam: behind a Function URL with AWS_IAM auth,"
            " the caller's IAM identity (from the request context) is the user."
        ),
    )
    auth_keys_backend: KeyStoreBackend = Field(
        "in_memory", description="Where API keys (hashed) live: in_memory, file or dynamodb."
    )
    auth_keys_table: str = Field(
        "agentscope-api-keys", min_length=3, description="DynamoDB table of the dynamodb key store."
    )
    auth_keys_cache_seconds: float = Field(
        30.0,
        ge=0,
        le=300,
        description=(
            "How long a process keeps a key read from the dynamodb key store; a revoke made"
            " elsewhere takes effect within this time. 0: no cache."
        ),
    )
    auth_keys_file: Path = Field(
        Path("~/.agentscope-serverless/keys.json"),
        description="The key file of the file key store (written with 0600 permissions).",
    )
    max_request_bytes: int = Field(
        1_048_576, ge=1, description="Largest accepted request body in bytes (413 above)."
    )
    sse_ping_interval_seconds: float = Field(
        15.0, gt=0, description="Send a `: ping` comment when a stream is silent this long."
    )
    web_ui: bool = Field(
        False,
        description="Serve the chat page at `/` (the local server turns it on; off in the cloud).",
    )

    llm_base_url: str = Field(
        "https://api.openai.com/v1", description="Base URL of an OpenAI-compatible chat API."
    )
    llm_api_key: SecretStr | None = Field(None, description="API key of the chat API.")
    llm_model: str = Field("gpt-4o-mini", min_length=1, description="Model name for the chat API.")
    llm_system_prompt: str = Field(
        "You are a helpful assistant.", description="System prompt of the LLM agent."
    )
    llm_max_iterations: int = Field(
        8, ge=1, le=100, description="Most model calls per request when the model calls tools."
    )
    llm_timeout_seconds: float = Field(
        60.0, gt=0, description="Timeout of one call to the chat API."
    )

    @field_validator("auth_keys_file")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        return value.expanduser()


def load_settings(**overrides: object) -> Settings:
    """Read and validate the settings, raising :class:`ConfigurationError` on bad values.

    ``overrides`` take precedence over the environment.
    """
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']).upper() or 'SETTINGS'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigurationError(f"invalid settings: {problems}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return load_settings()


__all__ = ["Settings", "get_settings", "load_settings"]
