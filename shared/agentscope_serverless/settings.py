"""One settings object, read from environment variables and validated once at start-up.

Every setting is an environment variable of the same name in upper case, for example
``SESSION_HISTORY_BACKEND=redis`` (any case is read; an empty variable counts as unset). A bad
value fails at start-up with the variable's name and what is wrong with it (never its value,
which may be a secret).

>>> Settings(session_history_backend="in_memory").memory_backend
'in_memory'
"""

from __future__ import annotations

import difflib
import math
import os
import re
import ssl
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.log import MIN_SECRET_LENGTH, SERVICE, logger
from agentscope_serverless.services._validation import MAX_TTL_SECONDS

SessionHistoryBackend = Literal["in_memory", "redis", "dynamodb"]
MemoryBackend = Literal["in_memory", "redis"]
StateBackend = Literal["in_memory", "redis", "dynamodb"]
RunsBackend = Literal["in_memory", "redis", "dynamodb", "none"]
KeyStoreBackend = Literal["in_memory", "file", "dynamodb"]
AuthMode = Literal["keys", "iam"]

_AGENT_APP_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"


def _environment_values(names: Iterable[str]) -> dict[str, str]:
    """The non-empty environment variables named like one of ``names`` in any case, by name."""
    wanted = {name.lower(): name for name in names}
    return {
        wanted[variable.lower()]: value
        for variable, value in os.environ.items()
        if variable.lower() in wanted and value
    }


def closest_name(name: str, names: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The one of ``names`` that ``name`` is likely a misspelling of (compared in any case:
    one differing only by case is the closest), or None when none is close enough.

    >>> closest_name("LLMApiKy", ["LlmApiKey", "LlmModel"])
    'LlmApiKey'
    >>> closest_name("llm_api_key", ["LLM_API_KEY"])
    'LLM_API_KEY'
    """
    by_upper = {known.upper(): known for known in names}
    found = difflib.get_close_matches(name.upper(), list(by_upper), n=1, cutoff=cutoff)
    return by_upper[found[0]] if found else None


# How close a variable's name must be to a setting's to be taken for a misspelling of it: one
# letter off in a name of ten or more (the process's other variables, PATH, OPENAI_API_KEY...,
# are far from every setting's).
NEAR_MISS_CUTOFF = 0.9
# The least TIME_LIMIT_MARGIN_SECONDS: the cut of a run's cleanup at its time limit (1 s,
# cancellation.TIME_LIMIT_CLEANUP_SECONDS), then the write of its end and its answer.
MIN_TIME_LIMIT_MARGIN_SECONDS = 2.0


def near_miss_variables(names: Iterable[str]) -> dict[str, str]:
    """Each of ``names`` (environment variables) that is no setting but so close to one that
    it is likely a misspelling of it (``SESSION_HISTORY_BACKND``), with that setting's
    variable; a misspelt setting is otherwise ignored without a word.

    >>> near_miss_variables(["STATE_BACKEN", "PATH", "OPENAI_API_KEY", "state_backend"])
    {'STATE_BACKEN': 'STATE_BACKEND'}
    """
    settings = [name.upper() for name in Settings.model_fields]
    found = {
        name: closest_name(name, settings, cutoff=NEAR_MISS_CUTOFF)
        for name in names
        if name.upper() not in settings
    }
    return {name: setting for name, setting in found.items() if setting is not None}


def near_miss_message(misses: Mapping[str, str]) -> str:
    """The names of ``misses`` (from :func:`near_miss_variables`), each with the setting it
    is likely meant for."""
    return ", ".join(f"{name} (did you mean {setting}?)" for name, setting in misses.items())


@lru_cache(maxsize=1)
def _warn_near_misses(misses: tuple[tuple[str, str], ...]) -> None:
    """One warning line naming ``misses`` (never their values), once for the same ones."""
    logger.warning(
        "environment variables that are no setting, ignored: %s", near_miss_message(dict(misses))
    )


# What a CloudWatch namespace may hold, and a dimension's value.
_NAMESPACE = re.compile(r"[0-9A-Za-z.\-_/#: ]+")
_DIMENSION_VALUE = re.compile(r"(?=.*[^ ])[ -~]{1,1024}")
# A web origin: scheme://host[:port], in any case.
_ORIGIN = re.compile(r"(https?)://([^/\s:]+)(?::(\d{1,5}))?", re.IGNORECASE)
TASKS_MAX_RUNNING = 64  # the default of ``tasks_max_running``
_DEFAULT_PORTS = {"http": 80, "https": 443}
# The schemes each URL setting takes (the Redis client's own for REDIS_URL).
_HTTP_SCHEMES = ("http", "https")
_URL_SCHEMES = {
    "llm_base_url": _HTTP_SCHEMES,
    "sandbox_base_url": _HTTP_SCHEMES,
    "a2a_base_url": _HTTP_SCHEMES,
    "dynamodb_endpoint_url": _HTTP_SCHEMES,
    "lambda_endpoint_url": _HTTP_SCHEMES,
    "secrets_endpoint_url": _HTTP_SCHEMES,
    "redis_url": ("redis", "rediss", "unix"),
}
# What a value with white space around it is told: no server takes such a key, model, region
# or file name (the request fails as it is sent, or is refused), and a URL or path is used as
# it is given.
PADDED = (
    "its value begins or ends with white space, such as a newline or the \\r a Windows line "
    "ending leaves: remove it"
)
BLANK = "its value is only white space: give a value, or leave the variable unset"
# The settings of free text, taken as they are (white space around a prompt is the user's).
_FREE_TEXT = frozenset({"llm_system_prompt"})
# The options the Redis client takes in REDIS_URL's query (redis-py's URL_QUERY_ARGUMENT_PARSERS
# and the text options its connections take; tests check them against it): any other reaches
# its connections and fails every command. The TLS ones only with rediss://.
_REDIS_URL_OPTIONS = (
    "db",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_read_size",
    "socket_keepalive",
    "retry_on_timeout",
    "max_connections",
    "health_check_interval",
    "protocol",
    "client_name",
    "username",
    "password",
)
_REDIS_URL_TLS_OPTIONS = (
    "ssl_check_hostname",
    "ssl_include_verify_flags",
    "ssl_exclude_verify_flags",
    "ssl_min_version",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_password",
    "ssl_ciphers",
)


def _whole_number(least: int) -> Callable[[str], bool]:
    return lambda value: re.fullmatch(r"[0-9]{1,18}", value) is not None and int(value) >= least


def _seconds(value: str) -> bool:
    try:
        seconds = float(value)
    except ValueError:
        return False
    return math.isfinite(seconds) and seconds > 0


def _verify_flags(value: str) -> bool:
    names = value.replace("[", "").replace("]", "").split(",")
    return all(name.strip() in ssl.VerifyFlags.__members__ for name in names)


# What each option of REDIS_URL's query takes (as a refusal says it) and its check. The
# Redis client takes more, then fails every request needing Redis (nan seconds, a timeout
# of -1, protocol 9) or reads the value as another ("off" as true).
_REDIS_BOOLEANS = ("true", "false", "yes", "no", "t", "f", "y", "n", "1", "0")
_YES_NO = ("true or false (or yes, no, 1, 0)", lambda value: value.lower() in _REDIS_BOOLEANS)
_REDIS_URL_OPTION_VALUES: dict[str, tuple[str, Callable[[str], bool]]] = {
    "db": ("a database number (0, 1, ...)", _whole_number(0)),
    "socket_timeout": ("a finite number of seconds above 0", _seconds),
    "socket_connect_timeout": ("a finite number of seconds above 0", _seconds),
    "socket_read_size": ("a whole number of bytes above 0", _whole_number(1)),
    "socket_keepalive": _YES_NO,
    "retry_on_timeout": _YES_NO,
    "max_connections": ("a whole number above 0", _whole_number(1)),
    "health_check_interval": ("a whole number of seconds (0: none)", _whole_number(0)),
    "protocol": ("2 or 3", lambda value: value in ("2", "3")),
    "ssl_check_hostname": _YES_NO,
    "ssl_include_verify_flags": (
        "names of ssl.VerifyFlags, such as VERIFY_X509_STRICT",
        _verify_flags,
    ),
    "ssl_exclude_verify_flags": (
        "names of ssl.VerifyFlags, such as VERIFY_X509_STRICT",
        _verify_flags,
    ),
    "ssl_min_version": (
        "a TLS version's number: 771 for TLS 1.2, 772 for TLS 1.3",
        lambda value: value in ("769", "770", "771", "772"),
    ),
    "ssl_cert_reqs": (
        "none, optional or required",
        lambda value: value in ("none", "optional", "required"),
    ),
}
# What LLM_SYSTEM_PROMPT is set to for no system prompt (an empty variable counts as unset).
NO_SYSTEM_PROMPT = "none"


class Settings(BaseModel):
    """Every setting of the project, with its environment variable and default.

    Built with keyword arguments, those win over the environment; built from a mapping
    (``Settings.model_validate``), the environment is not read.
    """

    # Defaults are validated like the environment's values (``~`` of AUTH_KEYS_FILE expands).
    # Numbers are finite: inf would be a limit that never comes (a stalled body waited for
    # forever) or no time to compute (a lease's end).
    model_config = ConfigDict(
        extra="ignore", frozen=True, validate_default=True, allow_inf_nan=False
    )

    def __init__(self, **values: Any) -> None:
        super().__init__(**{**_environment_values(type(self).model_fields), **values})

    session_history_backend: SessionHistoryBackend = Field(
        "in_memory", description="Where session history lives: in_memory, redis or dynamodb."
    )
    memory_backend: MemoryBackend = Field(
        "in_memory", description="Where long-term memory lives: in_memory or redis."
    )
    state_backend: StateBackend = Field(
        "in_memory", description="Where agent state lives: in_memory, redis or dynamodb."
    )
    runs_backend: RunsBackend | None = Field(
        None,
        description=(
            "Where runs (status and events, for resume and cancel) live: in_memory, redis or"
            " dynamodb; unset: the session history backend. none: runs are not stored (no"
            " /runs routes, background tasks or A2A)."
        ),
    )
    runs_ttl_seconds: int = Field(
        86400,
        # A run in progress writes its record every 10 s, and one silent for 60 s is read as
        # lost (RUN_LOST): kept less, a run went 404 while it ran, its end never stored.
        ge=60,
        le=MAX_TTL_SECONDS,
        description="How long a run and its events are kept after its last write (60 or more).",
    )
    runs_cancel_poll_seconds: float = Field(
        0.25,
        gt=0,
        le=1,
        description="How often a running run checks the store for a cancellation request.",
    )

    tasks_function_name: str | None = Field(
        None,
        description=(
            "The Lambda function that runs background tasks (asynchronous invocations);"
            " unset: tasks run in the server that accepted them."
        ),
    )
    lambda_endpoint_url: str | None = Field(
        None, description="Lambda API endpoint (for a local emulator); unset: AWS."
    )
    tasks_max_running: int = Field(
        TASKS_MAX_RUNNING,
        ge=1,
        le=10_000,
        description=(
            "Background tasks one server runs at once (a plain function holds a thread while"
            " it runs); a submission past it is refused, 429 TASK_CAPACITY with Retry-After."
            " Not used with TASKS_FUNCTION_NAME (1 to 10000)."
        ),
    )
    tasks_max_running_per_user: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description=(
            "Background tasks one user may run at once in one server (their share); past"
            " it, 429 TASK_QUOTA with Retry-After. Unset: TASKS_MAX_RUNNING (1 to 10000)."
        ),
    )
    time_limit_margin_seconds: float = Field(
        5.0,
        # Less leaves no time to end a run: its agent's cleanup is cut short only after
        # TIME_LIMIT_CLEANUP_SECONDS (1 s), and its end must then be stored and sent.
        ge=MIN_TIME_LIMIT_MARGIN_SECONDS,
        description=(
            "On Lambda: how long before the function's time limit a run or background task"
            " still going is ended (failed, TIME_LIMIT), so that its end is stored and sent;"
            " a stream following a stored run ends then too, for its client to resume. At"
            " most half the time an invocation has; 2 or more."
        ),
    )
    a2a_base_url: str | None = Field(
        None,
        description=(
            "The base URL in the A2A agent card (the Function URL on AWS); unset: the URL the"
            " card was requested at."
        ),
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
        None,
        ge=1,
        le=MAX_TTL_SECONDS,
        description="Sliding expiry of sessions in Redis/DynamoDB; unset: none.",
    )
    memory_ttl_seconds: int | None = Field(
        None,
        ge=1,
        le=MAX_TTL_SECONDS,
        description="Expiry of long-term memory; unset: memory never expires.",
    )
    state_ttl_seconds: int | None = Field(
        None, ge=1, le=MAX_TTL_SECONDS, description="Sliding expiry of agent state; unset: none."
    )
    max_messages_per_session: int | None = Field(
        None, ge=1, description="Keep only the newest N messages of a session; unset: all."
    )
    memory_redis_max_messages_per_session: int | None = Field(
        None,
        ge=1,
        description="Keep only the newest N long-term memories of a session on Redis; unset: all.",
    )

    dynamodb_sessions_table: str = Field(
        "agentscope-sessions", min_length=3, description="DynamoDB table for session history."
    )
    dynamodb_state_table: str = Field(
        "agentscope-state", min_length=3, description="DynamoDB table for agent state."
    )
    dynamodb_runs_table: str = Field(
        "agentscope-runs", min_length=3, description="DynamoDB table for runs and their events."
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
    agent_secrets_arn: str | None = Field(
        None,
        description=(
            "Secrets Manager secret (a JSON object of names and texts) of the agent's own "
            "secrets: each field becomes an environment variable of the process as the "
            "application starts, for the agent to read as it reads them locally."
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
        90.0,
        gt=0,
        description="Time limit of one call to the sandbox server, in seconds, its retries "
        "included (a retry gets what is left of it, and is not made with less than a second, "
        "or a quarter of it, left).",
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
        pattern=_AGENT_APP_PATTERN,
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
    request_body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description=(
            "Longest wait for the next part of a request body (408 when it stalls, and its"
            " connection is closed)."
        ),
    )
    request_head_timeout_seconds: float = Field(
        15.0,
        gt=0,
        description=(
            "How long a client has to send a request's line and headers, from connecting or"
            " from the first byte of its next request, before its connection is closed."
        ),
    )
    idempotency_expiry_seconds: int = Field(
        86_400,
        ge=1,
        le=MAX_TTL_SECONDS,
        description="How long an Idempotency-Key is remembered after its first use.",
    )
    idempotency_lease_seconds: float = Field(
        60.0,
        gt=0,
        description=(
            "How long a request in progress holds its Idempotency-Key unless it renews it"
            " (it does, three times a lease, while it runs); a retry after that takes the key"
            " over (the process serving the request stopped, or its store stopped answering)."
        ),
    )
    docs_require_key: bool = Field(
        False, description="Whether /docs and /openapi.json need an API key like other routes."
    )
    sse_ping_interval_seconds: float = Field(
        15.0, gt=0, description="Send a `: ping` comment when a stream is silent this long."
    )
    web_ui: bool = Field(
        False,
        description="Serve the chat page at `/` (the local server turns it on; off in the cloud).",
    )
    cors_allow_origins: tuple[str, ...] = Field(
        (),
        description=(
            "Origins whose browser pages may call the API, comma-separated (such as"
            " `https://app.example.com`; `*` for any): CORS headers and preflight answers."
            " Unset: none (a page of another origin cannot call it)."
        ),
    )

    metrics_namespace: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description=(
            "CloudWatch namespace of the run metrics (runs, duration, time to first token, "
            "tokens), written as Embedded Metric Format lines on stdout; unset: none."
        ),
    )

    llm_base_url: str = Field(
        "https://api.openai.com/v1", description="Base URL of an OpenAI-compatible chat API."
    )
    llm_api_key: SecretStr | None = Field(None, description="API key of the chat API.")
    llm_model: str = Field("gpt-4o-mini", min_length=1, description="Model name for the chat API.")
    llm_system_prompt: str = Field(
        "You are a helpful assistant.",
        description="System prompt of the LLM agent; none (in any case): no system prompt.",
    )
    llm_max_iterations: int = Field(
        8, ge=1, le=100, description="Most model calls per request when the model calls tools."
    )
    llm_max_retries: int = Field(
        2,
        ge=0,
        le=10,
        description=(
            "How many times a model call is made again when it fails before any of its reply "
            "arrived: a rate limit (429), a server error (408, 409, 5xx) or a lost connection. "
            "It waits as the API's `Retry-After` says (up to 60 s), else 0.5 s, 1 s, 2 s..."
        ),
    )
    llm_max_tool_output_chars: int = Field(
        20_000,
        ge=100,
        description=(
            "Longest tool output handed to the model, in characters: a longer one reaches it "
            "as its beginning and end with a note of how much was cut between them (the run's "
            "events and the session keep it whole). A huge output would otherwise exceed the "
            "model's context on this turn and on every later one that holds it."
        ),
    )
    llm_max_context_chars: int = Field(
        100_000,
        ge=1_000,
        description=(
            "Most characters (of the messages' JSON) the LLM agent sends the model: the "
            "oldest messages of the history window are left out until the rest fits (the "
            "system prompt and the new input always go; recalled memories take at most a "
            "quarter of it). Past a model's "
            "context every turn of the session would fail; raise it for models with a large "
            "one."
        ),
    )
    llm_timeout_seconds: float = Field(
        60.0,
        gt=0,
        description=(
            "Longest wait for the chat API: to connect, to answer, and between two pieces "
            "of data of its stream (keep-alive comments do not count)."
        ),
    )
    llm_max_reply_chars: int = Field(
        1_000_000,
        ge=1_000,
        description=(
            "Most characters of one model call's reply (its text, reasoning and tool calls; "
            "each chunk of the stream counts at least one): a longer reply fails the run with "
            "LLM_ERROR, so a model that never stops cannot hold a run for ever. One line of "
            "the stream, or a reply not streamed, may take 12 bytes per character of it plus "
            "1 MiB. The default is about twice the longest output models allow today (128k "
            "tokens, some 500,000 characters)."
        ),
    )

    @field_validator(*_URL_SCHEMES)
    @classmethod
    def _url_scheme(cls, value: object, info: ValidationInfo) -> object:
        url = value.get_secret_value() if isinstance(value, SecretStr) else value
        if not isinstance(url, str):
            return value
        schemes = _URL_SCHEMES[info.field_name or ""]
        parts = urlsplit(url)
        if parts.scheme.lower() not in schemes or (schemes is _HTTP_SCHEMES and not parts.netloc):
            raise ValueError(
                f"give a URL beginning with {' or '.join(f'{s}://' for s in schemes)}"
                + (" and a host" if schemes is _HTTP_SCHEMES else "")
            )
        if info.field_name == "redis_url":
            problem = redis_url_problem(url)
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("sandbox_bearer_token")
    @classmethod
    def _unguessable_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is None:
            return token
        # Imported here: the protocol's models are built on import, a cost that a process
        # without a sandbox server (most functions) does not pay at its start.
        from agentscope_serverless.sandbox_protocol import MIN_BEARER_TOKEN_LENGTH

        if len(token.get_secret_value()) < MIN_BEARER_TOKEN_LENGTH:
            raise ValueError(
                f"give a token of at least {MIN_BEARER_TOKEN_LENGTH} characters, as the "
                "sandbox server takes (a shorter one is guessed in few tries)"
            )
        return token

    @field_validator("llm_system_prompt")
    @classmethod
    def _no_system_prompt(cls, value: str) -> str:
        return "" if value.lower() == NO_SYSTEM_PROMPT else value

    @field_validator("agent_app", mode="before")
    @classmethod
    def _agent_import_path(cls, value: object) -> object:
        problem = agent_app_problem(value) if isinstance(value, str) else None
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("cors_allow_origins", mode="before")
    @classmethod
    def _origins(cls, value: object) -> object:
        if isinstance(value, str):
            value = [origin.strip() for origin in value.split(",") if origin.strip()]
        if isinstance(value, list | tuple):
            return [_browser_origin(o) if isinstance(o, str) else o for o in value]
        return value

    @field_validator("metrics_namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        # CloudWatch drops, without a word, every metric of a namespace it does not take.
        if value is not None and (
            not _NAMESPACE.fullmatch(value) or not value.strip() or value.startswith("AWS/")
        ):
            raise ValueError(
                "a CloudWatch namespace holds letters, digits and . - _ / # : or spaces (at "
                "least one not a space), and does not start with AWS/"
            )
        if value is not None and not _DIMENSION_VALUE.fullmatch(SERVICE):
            raise ValueError(
                "with metrics, POWERTOOLS_SERVICE_NAME is their Service dimension: CloudWatch "
                "takes 1 to 1024 printable ASCII characters, at least one not a space"
            )
        return value

    @field_validator("auth_keys_file")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        return value.expanduser()

    # Last: pydantic runs the validators before parsing from the last one defined.
    @field_validator("*", mode="before")
    @classmethod
    def _unpadded(cls, value: object, info: ValidationInfo) -> object:
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(text, str) and info.field_name not in _FREE_TEXT and text != text.strip():
            raise ValueError(PADDED if text.strip() else BLANK)
        return value


def _browser_origin(origin: str) -> str:
    """``origin`` (of CORS_ALLOW_ORIGINS) as a browser sends it in its Origin header, to be
    compared with it: scheme and host in lower case, no default port.

    >>> _browser_origin("HTTPS://App.Example.com:443")
    'https://app.example.com'
    """
    if origin == "*":
        return origin
    match = _ORIGIN.fullmatch(origin)
    if match is None or (match[3] is not None and int(match[3]) > 65535):
        raise ValueError(
            f"{origin!r} is not an origin: give scheme://host[:port], with no path or "
            "trailing slash, or *"
        )
    scheme, host, port = match[1].lower(), match[2].lower(), match[3]
    shown_port = "" if port is None or int(port) == _DEFAULT_PORTS[scheme] else f":{int(port)}"
    return f"{scheme}://{host}{shown_port}"


def agent_app_problem(value: str) -> str | None:
    """What is wrong with ``value`` as the AgentApp to serve (``AGENT_APP``, ``--agent``),
    with an example made of it; None when it is an import path ``module:attribute``.

    >>> agent_app_problem("./mypkg/agent.py").rpartition(" ")[2]
    'mypkg.agent:app'
    >>> agent_app_problem("mypkg.agent:app") is None
    True
    """
    module, _, attribute = value.partition(":")
    # agent.py:app names the file, not the module (Python would look for agent's module py).
    if re.fullmatch(_AGENT_APP_PATTERN, value) and not module.endswith(".py"):
        return None
    module = re.sub(r"\.py$", "", module.removeprefix("./")).replace("/", ".")
    example = f"{module}:{attribute or 'app'}"
    if not re.fullmatch(_AGENT_APP_PATTERN, example):
        example = "mypkg.agent:app"
    return (
        "give the AgentApp as module:attribute, the module's import path (not a file "
        f"path) and the name of its AgentApp, e.g. {example}"
    )


def redis_url_problem(url: str) -> str | None:
    """What is wrong with the path or the query of ``url`` (``REDIS_URL``): a path that is
    no database number, the first query option the Redis client does not take (naming those
    it takes) or a value of one it cannot use; never the URL, which may hold a password.
    None when the client takes it all.

    >>> redis_url_problem("redis://h:6379/0?socket_timeout=5") is None
    True
    >>> redis_url_problem("redis://h:6379/0?ssl=true").split(";")[0]
    "the query option 'ssl' is not one the Redis client takes (for TLS, begin the URL with rediss://)"
    >>> redis_url_problem("redis://h:6379/0?socket_timeout=nan")
    "the query option 'socket_timeout' takes a finite number of seconds above 0"
    >>> redis_url_problem("redis://h:6379/0?client_name=").split(":")[0]
    "the query option 'client_name' has no value, which the Redis client ignores"
    """
    parts = urlsplit(url)
    if "@" in parts.query:
        return "a ? in its password ends its address early: percent-encode it (%3F)"
    if "@" in parts.path:
        return "a / in its user name or password ends its address early: percent-encode it (%2F)"
    # A unix:// URL's path is its socket's. Of another URL, the client reads a path of digits
    # as the database number, and any other path as database 0, without a word.
    if parts.scheme.lower() != "unix" and not re.fullmatch(r"/?([0-9]+/?)?", parts.path):
        return "its path is not a database number: end it with /0, /1... or nothing (/0)"
    tls = parts.scheme.lower() == "rediss"
    accepted = [
        *(
            o
            for o in _REDIS_URL_OPTIONS
            if not (o == "socket_keepalive" and parts.scheme == "unix")
        ),
        *(_REDIS_URL_TLS_OPTIONS if tls else ()),
    ]
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in accepted:
            takes, valid = _REDIS_URL_OPTION_VALUES.get(name, ("", lambda _: True))
            # The client ignores a blank value, as if the option were not given.
            if not value:
                return (
                    f"the query option {name!r} has no value, which the Redis client "
                    f"ignores: give it {takes or 'one'}, or leave the option out"
                )
            # A wrong one is not shown (it may be a piece of a password holding & or =).
            if not valid(value):
                return f"the query option {name!r} takes {takes}"
            continue
        # A name that is no identifier may be a piece of a password.
        shown = repr(name) if re.fullmatch(r"[A-Za-z_]\w{0,63}", name) else "(not shown)"
        if name.lower() in ("ssl", "tls") and not tls:
            hint = " (for TLS, begin the URL with rediss://)"
        elif name in _REDIS_URL_TLS_OPTIONS:
            hint = " without TLS (begin the URL with rediss:// for it)"
        else:
            hint = ""
        return (
            f"the query option {shown} is not one the Redis client takes{hint}; it takes "
            + ", ".join(accepted)
        )
    return None


def secret_values(settings: Settings) -> list[str]:
    """Every secret of ``settings`` (and the password inside a connection URL) of at least
    :data:`~agentscope_serverless.log.MIN_SECRET_LENGTH` characters, longest first."""
    values = (getattr(settings, name) for name in type(settings).model_fields)
    return _secrets_of(value.get_secret_value() for value in values if isinstance(value, SecretStr))


def environment_secrets() -> list[str]:
    """The secrets the environment gives the settings (``LLM_API_KEY``...), as
    :func:`secret_values` finds them, whether the other settings are valid or not: what a
    process reading no settings (a build importing the agent) keeps out of what it prints."""
    secret = [
        name
        for name, field in Settings.model_fields.items()
        if SecretStr in (field.annotation, *get_args(field.annotation))
    ]
    return _secrets_of(_environment_values(secret).values())


def _secrets_of(raw_values: Iterable[str]) -> list[str]:
    """The values, and the passwords of those that are connection URLs, as written and as
    a client decodes them (``%40`` is ``@``): in the URL's user part or its ``password``
    query option (``redis://host?password=...``)."""
    secrets: list[str] = []
    for raw in raw_values:
        secrets.append(raw)
        if "://" not in raw:
            continue
        try:
            parts = urlsplit(raw)
            password = parts.password or ""
        except ValueError:
            continue
        secrets += [password, unquote(password)]
        for option in parts.query.split("&"):  # as written; parse_qsl decodes
            name, _, value = option.partition("=")
            if unquote_plus(name) == "password":
                secrets += [value, unquote_plus(value)]
    return sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)


def load_settings(**overrides: object) -> Settings:
    """Read and validate the settings, raising :class:`ConfigurationError` on bad values.

    ``overrides`` take precedence over the environment. An environment variable named
    almost as a setting (:func:`near_miss_variables`) is named in one warning line.
    """
    misses = near_miss_variables(os.environ)
    if misses:
        _warn_near_misses(tuple(sorted(misses.items())))
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise _invalid(exc) from None


def check_setting_variables(variables: Mapping[str, str]) -> None:
    """Raise :class:`ConfigurationError` as :func:`load_settings` would for the settings
    among ``variables`` (environment variables a service will start with, by name), without
    reading this process's environment; the others are not looked at."""
    wanted = {name.lower() for name in Settings.model_fields}
    given = {
        name.lower(): value for name, value in variables.items() if name.lower() in wanted and value
    }
    try:
        Settings.model_validate(given)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: ValidationError) -> ConfigurationError:
    problems = "; ".join(_problem(err) for err in exc.errors())
    return ConfigurationError(f"invalid settings: {problems}")


def _problem(error: Any) -> str:
    """One invalid setting: its variable and what is wrong (never its value)."""
    name = ".".join(str(part) for part in error["loc"])
    # A validator's own words, without the "Value error, " pydantic puts before them.
    return f"{name.upper() or 'SETTINGS'}: {error['msg'].removeprefix('Value error, ')}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of a process that is its own composition root (``AgentApp.run()``,
    ``await app.query(...)``, a runner on its own), read once: the environment, then the
    ``SECRETS_ARN`` secret, as ``serve`` and the Lambda functions read them."""
    from agentscope_serverless.aws_secrets import resolve_secrets

    return resolve_secrets(load_settings())


def port_number(port: Any) -> int:
    """``port`` (an int, or its decimal digits as text) as a port number; anything else, or a
    number past 65535 (which the socket layer would take modulo 65536: 80800 as 15264),
    raises :class:`ValueError` saying so.

    >>> port_number("8090")
    8090
    """
    text = port.strip() if isinstance(port, str) else None
    if text is not None and text.isascii() and text.isdigit():
        number: Any = int(text)
    else:
        number = port if isinstance(port, int) and not isinstance(port, bool) else None
    if number is None or not 0 <= number <= 65535:
        raise ValueError(f"port must be a port number from 0 to 65535, got {port!r}")
    return int(number)


def environment_port(default: int = 8080) -> int:
    """The ``PORT`` environment variable, which AgentScope's ``app.run()`` listens on and a
    platform running a script sets (``default`` when unset); a value that is no port number
    raises :class:`ConfigurationError` naming the variable."""
    value = os.environ.get("PORT", "").strip()
    if not value:
        return default
    if not (value.isascii() and value.isdigit()) or int(value) > 65535:
        raise ConfigurationError("PORT must be a port number from 0 to 65535")
    return int(value)


__all__ = [
    "BLANK",
    "NEAR_MISS_CUTOFF",
    "NO_SYSTEM_PROMPT",
    "PADDED",
    "Settings",
    "agent_app_problem",
    "check_setting_variables",
    "closest_name",
    "environment_port",
    "environment_secrets",
    "get_settings",
    "load_settings",
    "near_miss_message",
    "near_miss_variables",
    "port_number",
    "redis_url_problem",
    "secret_values",
]
