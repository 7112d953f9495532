"""CONTRACT §1: backends chosen by configuration, validated at start-up."""

from __future__ import annotations

import json
import logging

import pytest

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.local_stack import RedisServer
from agentscope_serverless.log import logger
from agentscope_serverless.services._validation import MAX_TTL_SECONDS
from agentscope_serverless.services.agent_state import InMemoryStateService
from agentscope_serverless.services.factory import (
    create_memory_service,
    create_service_manager,
    create_session_history_service,
    create_state_service,
)
from agentscope_serverless.services.memory import InMemoryMemoryService
from agentscope_serverless.services.session_history import InMemorySessionHistoryService
from agentscope_serverless.settings import PADDED, Settings, load_settings, redis_url_problem


def test_defaults_are_the_embedded_in_memory_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SESSION_HISTORY_BACKEND", "MEMORY_BACKEND", "STATE_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert isinstance(create_session_history_service(settings), InMemorySessionHistoryService)
    assert isinstance(create_memory_service(settings), InMemoryMemoryService)
    assert isinstance(create_state_service(settings), InMemoryStateService)


def test_backends_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSION_HISTORY_BACKEND", "IN_MEMORY".lower())
    monkeypatch.setenv("MAX_MESSAGES_PER_SESSION", "25")
    settings = load_settings()
    assert settings.session_history_backend == "in_memory"
    assert settings.max_messages_per_session == 25


def test_a_bad_backend_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSION_HISTORY_BACKEND", "postgres")
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    assert "SESSION_HISTORY_BACKEND" in str(raised.value)
    assert "in_memory" in str(raised.value)


def test_a_bad_number_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_MESSAGES_PER_SESSION", "many")
    with pytest.raises(ConfigurationError, match="MAX_MESSAGES_PER_SESSION"):
        load_settings()


async def test_the_cap_of_memories_per_session_on_redis_is_honoured(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, user_id: str
) -> None:
    # The README's setting reached only MemoryServiceFactory: the server kept every memory.
    monkeypatch.setenv("MEMORY_BACKEND", "redis")
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("MEMORY_REDIS_MAX_MESSAGES_PER_SESSION", "2")
    async with create_memory_service(load_settings()) as memory:
        for text in ("black tea", "green tea", "white tea"):
            await memory.add_memory(user_id, [{"role": "user", "content": text}], "s")
        kept = await memory.list_memory(user_id)
    assert sorted(m.get_text_content() for m in kept) == ["green tea", "white tea"]


@pytest.mark.parametrize("value", ["0", "-3", "many", "2.5", " ", "2 "])
def test_a_cap_of_memories_that_is_no_positive_whole_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("MEMORY_REDIS_MAX_MESSAGES_PER_SESSION", value)
    with pytest.raises(ConfigurationError, match="MEMORY_REDIS_MAX_MESSAGES_PER_SESSION"):
        load_settings()


@pytest.mark.parametrize("variable", ["TASKS_MAX_RUNNING", "TASKS_MAX_RUNNING_PER_USER"])
@pytest.mark.parametrize("value", ["0", "-3", "many", "2.5", "10001"])
def test_a_bound_on_tasks_at_once_that_is_no_whole_number_from_1_to_10000_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=variable):
        load_settings()


def test_a_negative_ttl_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSION_TTL_SECONDS", "-5")
    with pytest.raises(ConfigurationError, match="SESSION_TTL_SECONDS"):
        load_settings()


def test_runs_kept_less_than_a_run_may_stay_silent_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # RUNS_TTL_SECONDS=6 was taken: a run went 404 while it ran, and its end was never stored.
    monkeypatch.setenv("RUNS_TTL_SECONDS", "59")
    with pytest.raises(ConfigurationError, match="RUNS_TTL_SECONDS"):
        load_settings()
    monkeypatch.setenv("RUNS_TTL_SECONDS", "60")
    assert load_settings().runs_ttl_seconds == 60


@pytest.mark.parametrize(
    "variable",
    [
        "RUNS_CANCEL_POLL_SECONDS",
        "TIME_LIMIT_MARGIN_SECONDS",
        "SANDBOX_TIMEOUT_SECONDS",
        "AUTH_KEYS_CACHE_SECONDS",
        "REQUEST_BODY_TIMEOUT_SECONDS",
        "IDEMPOTENCY_LEASE_SECONDS",
        "SSE_PING_INTERVAL_SECONDS",
        "LLM_TIMEOUT_SECONDS",
    ],
)
@pytest.mark.parametrize("value", ["inf", "nan", "1e400"])
def test_a_duration_that_is_no_finite_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """inf was taken: IDEMPOTENCY_LEASE_SECONDS=inf failed every request with an
    Idempotency-Key (a 500: no lease end to store), REQUEST_BODY_TIMEOUT_SECONDS=inf waited
    for a stalled body forever."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    assert variable in str(raised.value)


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf", "Infinity", "1e400"])
def test_a_request_head_timeout_that_is_no_finite_positive_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, seconds: str
) -> None:
    """``inf`` (or a number too large for a float) turned the limit off, unsaid: a client
    sending half a request head held its connection open forever again."""
    monkeypatch.setenv("REQUEST_HEAD_TIMEOUT_SECONDS", seconds)
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    assert "REQUEST_HEAD_TIMEOUT_SECONDS" in str(raised.value)
    assert "finite" in str(raised.value) or "greater than 0" in str(raised.value)


@pytest.mark.parametrize(
    "variable",
    [
        "SESSION_TTL_SECONDS",
        "MEMORY_TTL_SECONDS",
        "STATE_TTL_SECONDS",
        "RUNS_TTL_SECONDS",
        "IDEMPOTENCY_EXPIRY_SECONDS",
    ],
)
def test_a_ttl_longer_than_every_store_takes_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    # Taken, it made every call on Redis fail as if the store were down.
    monkeypatch.setenv(variable, str(MAX_TTL_SECONDS + 1))
    with pytest.raises(ConfigurationError, match=variable):
        load_settings()
    monkeypatch.setenv(variable, str(MAX_TTL_SECONDS))
    assert getattr(load_settings(), variable.lower()) == MAX_TTL_SECONDS


def test_configuration_errors_never_echo_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://:hunter2-secret@cache:6379/0")
    monkeypatch.setenv("REDIS_CLUSTER", "sometimes")
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    assert "REDIS_CLUSTER" in str(raised.value)
    assert "hunter2" not in str(raised.value)
    settings = load_settings(redis_cluster=False)
    assert "hunter2" not in repr(settings)


def test_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_BACKEND", "postgres")
    assert load_settings(state_backend="in_memory").state_backend == "in_memory"


def test_services_come_back_not_started() -> None:
    service = create_session_history_service(load_settings())
    assert service._started is False


async def test_service_manager_holds_the_three_services() -> None:
    manager = create_service_manager(load_settings())
    assert manager.list_services() == ["session_history", "memory", "state"]
    async with manager:
        assert await manager.health_check() == {
            "session_history": True,
            "memory": True,
            "state": True,
        }


def test_the_environment_is_read_in_any_case_and_empty_variables_are_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("llm_model", "small-model")
    monkeypatch.setenv("MAX_MESSAGES_PER_SESSION", "")
    settings = load_settings()
    assert settings.llm_model == "small-model"
    assert settings.max_messages_per_session is None


def test_defaults_are_validated_like_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTH_KEYS_FILE", raising=False)
    assert "~" not in str(load_settings().auth_keys_file)


@pytest.mark.parametrize(
    "variable", ["LLM_API_KEY", "SANDBOX_BEARER_TOKEN", "REDIS_PASSWORD", "REDIS_URL"]
)
@pytest.mark.parametrize("padding", [" {}", "{}\n", "\t{}\r\n"])
def test_a_secret_with_white_space_around_it_is_refused_naming_it_never_quoting_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, padding: str
) -> None:
    # Taken, every run failed: "cannot reach the chat API ... LocalProtocolError".
    monkeypatch.setenv(variable, padding.format("redis://:sk-hush-42@cache:6379/0"))
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith(f"invalid settings: {variable}: its value begins or ends with")
    assert "hush" not in message and message.count("white space") == 1, message


def test_a_sandbox_token_shorter_than_the_sandbox_server_takes_is_refused_never_quoted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A token of a few characters is guessed in few tries: our sandbox server refuses one.
    monkeypatch.setenv("SANDBOX_BEARER_TOKEN", "hush-15-letters")
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith("invalid settings: SANDBOX_BEARER_TOKEN: give a token of at least")
    assert "hush" not in message
    monkeypatch.setenv("SANDBOX_BEARER_TOKEN", "hush-16-letters!")
    assert load_settings().sandbox_bearer_token is not None


@pytest.mark.parametrize(
    ("variable", "value", "schemes"),
    [
        ("LLM_BASE_URL", "api.openai.com/v1", "http:// or https://"),
        ("LLM_BASE_URL", "https://", "http:// or https://"),
        ("SANDBOX_BASE_URL", "sandbox.internal:8000", "http:// or https://"),
        ("DYNAMODB_ENDPOINT_URL", "localhost:8000", "http:// or https://"),
        ("LAMBDA_ENDPOINT_URL", "ftp://localhost:3001", "http:// or https://"),
        ("SECRETS_ENDPOINT_URL", "localhost:5000", "http:// or https://"),
        ("A2A_BASE_URL", "agent.example.com", "http:// or https://"),
        ("REDIS_URL", "localhost:6379", "redis:// or rediss:// or unix://"),
        ("REDIS_URL", "http://:hush-pw@cache:6379", "redis:// or rediss:// or unix://"),
    ],
)
def test_a_url_setting_without_a_scheme_it_takes_is_refused_naming_the_schemes(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, schemes: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith(f"invalid settings: {variable}: give a URL beginning with {schemes}")
    assert "hush" not in message


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LLM_BASE_URL", "http://127.0.0.1:8000/v1"),
        ("REDIS_URL", "rediss://:pw@cache:6379/0"),
        ("REDIS_URL", "unix:///run/redis.sock?db=1"),
        ("DYNAMODB_ENDPOINT_URL", "HTTPS://dynamodb.local"),
    ],
)
def test_urls_with_a_scheme_they_take_are_kept(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    kept = getattr(load_settings(), variable.lower())
    assert (kept if isinstance(kept, str) else kept.get_secret_value()) == value


def test_a_variable_named_almost_as_a_setting_is_named_in_one_warning_without_its_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ignored without a word, a misspelt backend left the stores in memory.
    # The suite logs only critical lines; setLevel (not the attribute) also forgets what the
    # logger decided at the level before, and after.
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        named_in_one_warning(monkeypatch, capsys)
    finally:
        logger.setLevel(level)


def named_in_one_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSION_HISTORY_BACKND", "redis-hush")
    monkeypatch.setenv("state_backen", "dynamodb-hush")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-own-hush")
    monkeypatch.setenv("llm_model", "m")  # a setting, in another case: read, not named
    settings = load_settings()
    load_settings()
    assert settings.session_history_backend == "in_memory"
    [line] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert line["level"] == "WARNING"
    assert line["message"] == (
        "environment variables that are no setting, ignored: SESSION_HISTORY_BACKND (did you "
        "mean SESSION_HISTORY_BACKEND?), state_backen (did you mean STATE_BACKEND?)"
    )


@pytest.mark.parametrize(
    "variable",
    [
        "LLM_BASE_URL",
        "LLM_MODEL",
        "AWS_REGION",
        "AUTH_KEYS_FILE",
        "DYNAMODB_SESSIONS_TABLE",
        "TASKS_FUNCTION_NAME",
        "RUNS_TTL_SECONDS",
    ],
)
@pytest.mark.parametrize("padding", [" {}", "{}\r", "\t{}\r\n"])
def test_any_setting_with_white_space_around_it_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, padding: str
) -> None:
    # Taken as it was: a key file of that name (every key refused), a model 'gpt-4o\r'.
    value = {"LLM_BASE_URL": "http://127.0.0.1:9/v1", "RUNS_TTL_SECONDS": "60"}.get(
        variable, "agentscope-sessions"
    )
    monkeypatch.setenv(variable, padding.format(value))
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    assert str(refused.value) == f"invalid settings: {variable}: {PADDED}"


@pytest.mark.parametrize("variable", ["LLM_MODEL", "AWS_REGION", "AGENT_APP", "SECRETS_ARN"])
@pytest.mark.parametrize("blank", [" ", "\r", "\t \n"])
def test_a_setting_of_only_white_space_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, blank: str
) -> None:
    monkeypatch.setenv(variable, blank)
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    assert str(refused.value) == (
        f"invalid settings: {variable}: its value is only white space: give a value, or leave "
        "the variable unset"
    )


def test_the_system_prompt_is_free_text_taken_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_SYSTEM_PROMPT", "  Answer in French.\n")
    assert load_settings().llm_system_prompt == "  Answer in French.\n"


@pytest.mark.parametrize(("value", "prompt"), [("none", ""), ("None", ""), ("", "default")])
def test_the_system_prompt_none_is_no_system_prompt_and_empty_is_the_default(
    monkeypatch: pytest.MonkeyPatch, value: str, prompt: str
) -> None:
    monkeypatch.setenv("LLM_SYSTEM_PROMPT", value)
    expected = Settings.model_fields["llm_system_prompt"].default if prompt else ""
    assert load_settings().llm_system_prompt == expected


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "redis://:hush-pw@cache:6379/0?ssl=true",
            "the query option 'ssl' is not one the Redis client takes (for TLS, begin the URL "
            "with rediss://); it takes db, socket_timeout,",
        ),
        (
            "redis://:hush-pw@cache:6379/0?ssl_cert_reqs=none",
            "the query option 'ssl_cert_reqs' is not one the Redis client takes without TLS "
            "(begin the URL with rediss:// for it); it takes db,",
        ),
        (
            "redis://cache:6379/0?socket_timeout=5&sockettimeout=5",
            "the query option 'sockettimeout' is not one the Redis client takes; it takes db,",
        ),
        ("unix:///run/redis.sock?socket_keepalive=true", "the query option 'socket_keepalive'"),
        # What follows a ? in a password is no option's name: not shown.
        ("redis://:hu?sh-pw@cache:6379/0", "a ? in its password ends its address early"),
        ("redis://cache:6379/0?db=1&hu$sh=pw", "the query option (not shown) is not one"),
    ],
)
def test_a_redis_url_option_the_client_does_not_take_is_refused_naming_the_option(
    monkeypatch: pytest.MonkeyPatch, url: str, said: str
) -> None:
    # Taken, the server started and every request needing Redis was a 500 (a TypeError).
    monkeypatch.setenv("REDIS_URL", url)
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith(f"invalid settings: REDIS_URL: {said}"), message
    assert "hush" not in message and "pw" not in message


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("socket_timeout=nan", "'socket_timeout' takes a finite number of seconds above 0"),
        ("socket_timeout=-1", "'socket_timeout' takes a finite number of seconds above 0"),
        ("socket_timeout=inf", "'socket_timeout' takes a finite number of seconds above 0"),
        ("socket_connect_timeout=0", "'socket_connect_timeout' takes a finite number of"),
        ("protocol=9", "'protocol' takes 2 or 3"),
        ("max_connections=0", "'max_connections' takes a whole number above 0"),
        ("health_check_interval=1.5", "'health_check_interval' takes a whole number of"),
        ("db=abc", "'db' takes a database number"),
        ("retry_on_timeout=off", "'retry_on_timeout' takes true or false"),
        ("db=1&socket_read_size=-5", "'socket_read_size' takes a whole number of bytes"),
    ],
)
def test_a_redis_url_option_value_the_client_cannot_use_is_refused_without_showing_the_url(
    monkeypatch: pytest.MonkeyPatch, option: str, said: str
) -> None:
    # Taken, every request needing Redis was a 500 (nan) or a 503 (a timeout of -1,
    # protocol 9), or "off" was read as true.
    monkeypatch.setenv("REDIS_URL", f"redis://:hush-pw@cache:6379/0?{option}")
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith(f"invalid settings: REDIS_URL: the query option {said}"), message
    assert "hush" not in message and "cache" not in message


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (
            "socket_timeout=",
            "'socket_timeout' has no value, which the Redis client ignores: give"
            " it a finite number of seconds above 0, or leave the option out",
        ),
        ("db=1&max_connections=", "'max_connections' has no value"),
        ("protocol", "'protocol' has no value"),
        ("password=&db=1", "'password' has no value, which the Redis client ignores: give it one"),
    ],
)
def test_a_redis_url_option_without_a_value_is_refused_without_showing_the_url(
    monkeypatch: pytest.MonkeyPatch, option: str, said: str
) -> None:
    # Taken, the client ignored it: the server ran without the timeout, pool bound or
    # password its URL seemed to set.
    monkeypatch.setenv("REDIS_URL", f"redis://:hush-pw@cache:6379/0?{option}")
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith(f"invalid settings: REDIS_URL: the query option {said}"), message
    assert "hush" not in message and "cache" not in message


@pytest.mark.parametrize("path", ["/3x", "/abc", "/0/1", "/-1"])
def test_a_redis_url_path_that_is_no_database_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    # Taken, the Redis client used database 0 (or read /0/1 as 1) without a word.
    monkeypatch.setenv("REDIS_URL", f"rediss://:hush-pw@cache:6379{path}")
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith("invalid settings: REDIS_URL: its path is not a database number")
    assert "hush" not in message and path not in message


def test_a_slash_in_a_redis_password_is_refused_at_start_without_showing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://:Wq7z/Pa55-tail@cache:6379/0")
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    message = str(refused.value)
    assert "percent-encode it (%2F)" in message
    assert "Wq7z" not in message and "Pa55" not in message


@pytest.mark.parametrize(
    "url",
    [
        "redis://:pw@cache:6379/0?socket_timeout=5&health_check_interval=10&client_name=agent",
        "rediss://cache:6379/0?ssl_cert_reqs=none&ssl_check_hostname=false",
        "unix:///run/redis.sock?db=1&socket_timeout=2",
        "redis://cache:6379/12?socket_timeout=0.5&protocol=3&retry_on_timeout=No",
        "rediss://cache:6379/?socket_keepalive=1&ssl_min_version=771",
        "redis://cache:6379",
        "redis://cache:6379/3/",
        "unix:///run/redis/redis.sock",
    ],
)
def test_a_redis_url_with_options_the_client_takes_is_kept(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setenv("REDIS_URL", url)
    assert load_settings().redis_url.get_secret_value() == url


# A value of each option the Redis client takes in a URL.
_REDIS_OPTION_VALUES = {
    "db": "1",
    "socket_timeout": "5",
    "socket_connect_timeout": "5",
    "socket_read_size": "65536",
    "socket_keepalive": "true",
    "retry_on_timeout": "true",
    "max_connections": "5",
    "health_check_interval": "5",
    "protocol": "2",
    "client_name": "agent",
    "username": "user",
    "password": "pw",
    "ssl_check_hostname": "false",
    "ssl_include_verify_flags": "VERIFY_X509_STRICT",
    "ssl_exclude_verify_flags": "VERIFY_X509_STRICT",
    "ssl_min_version": "771",
    "ssl_cert_reqs": "none",
    "ssl_ca_certs": "/etc/ssl/ca.pem",
    "ssl_ca_path": "/etc/ssl",
    "ssl_certfile": "/etc/ssl/client.pem",
    "ssl_keyfile": "/etc/ssl/client.key",
    "ssl_password": "pw",
    "ssl_ciphers": "HIGH",
}


@pytest.mark.parametrize("scheme", ["redis", "rediss", "unix"])
def test_every_redis_url_option_accepted_is_one_the_redis_client_builds_a_connection_with(
    scheme: str,
) -> None:
    from redis.asyncio import Redis

    base = "unix:///run/redis.sock" if scheme == "unix" else f"{scheme}://cache:6379/0"
    accepted = redis_url_problem(f"{base}?no_such_option=1")
    assert accepted is not None
    names = accepted.partition("; it takes ")[2].split(", ")
    assert names and set(names) <= set(_REDIS_OPTION_VALUES)
    for name in names:
        client = Redis.from_url(f"{base}?{name}={_REDIS_OPTION_VALUES[name]}")
        client.connection_pool.make_connection()  # a TypeError for an option it does not take


@pytest.mark.parametrize(
    ("redis_url", "password"),
    [
        ("redis://:Pw%40Secret%2F9876@127.0.0.1:6379/0", "Pw@Secret/9876"),
        ("redis://127.0.0.1:6379/0?password=Pw%40Secret%2F9876", "Pw@Secret/9876"),
        ("redis://127.0.0.1:6379/0?db=0&password=S3cret+Redis", "S3cret Redis"),
    ],
    ids=["encoded in the user part", "encoded in the query", "plus in the query"],
)
def test_a_redis_password_is_masked_as_the_client_decodes_it(redis_url: str, password: str) -> None:
    """A password written percent-encoded (as ``@ / ? #`` must be) or as the ``password``
    query option was masked only as written: an error quoting the client's connection
    options (``{'password': 'Pw@Secret/9876'}``) showed it."""
    import redis

    from agentscope_serverless.log import redact, redacted
    from agentscope_serverless.settings import load_settings, secret_values

    redact(secret_values(load_settings(redis_url=redis_url)))
    options = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs
    assert options["password"] == password
    assert password not in redacted(f"could not connect with {options!r}")
    assert password not in redacted(json.dumps({"password": options["password"]}))


@pytest.mark.parametrize("seconds", ["0", "-0", "0.5", "1.9"])
def test_a_time_limit_margin_too_short_to_end_a_run_is_refused(
    monkeypatch: pytest.MonkeyPatch, seconds: str
) -> None:
    """0 (and -0) or 0.5 were taken: a run at its time limit has its agent's cleanup cut
    after 1 s, then its end stored, so it was answered after the function's time limit."""
    monkeypatch.setenv("TIME_LIMIT_MARGIN_SECONDS", seconds)
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    assert "TIME_LIMIT_MARGIN_SECONDS" in str(raised.value) and "2" in str(raised.value)
    monkeypatch.setenv("TIME_LIMIT_MARGIN_SECONDS", "2")
    assert load_settings().time_limit_margin_seconds == 2
