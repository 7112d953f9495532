"""Secrets of the SAM stack, read from Secrets Manager (moto's server over HTTP)."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from agentscope_serverless.aws_secrets import export_agent_secrets, resolve_secrets
from agentscope_serverless.errors import ConfigurationError, StoreUnavailableError
from agentscope_serverless.local_stack import DynamoDBServer
from agentscope_serverless.settings import Settings, load_settings


def make_secret(server: DynamoDBServer, name: str, value: str) -> str:
    client = boto3.client(
        "secretsmanager",
        endpoint_url=server.endpoint_url,
        region_name=server.region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    arn: str = client.create_secret(Name=name, SecretString=value)["ARN"]
    return arn


def secrets_settings(server: DynamoDBServer, **settings: Any) -> Settings:
    """``settings``, their secrets read from ``server`` (moto's Secrets Manager)."""
    return load_settings(
        secrets_endpoint_url=server.endpoint_url, aws_region=server.region, **settings
    )


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_settings_without_a_secret_come_back_unchanged() -> None:
    settings = load_settings(secrets_arn=None)
    assert resolve_secrets(settings) is settings


def test_non_empty_secret_fields_fill_the_settings(dynamodb_server: DynamoDBServer) -> None:
    arn = make_secret(
        dynamodb_server,
        "stack-secrets-filled",
        json.dumps(
            {
                "llm_api_key": "sk-from-secret",
                "sandbox_bearer_token": "",
                "redis_url": "rediss://:pw@cache:6379/0",
            }
        ),
    )
    settings = secrets_settings(
        dynamodb_server,
        secrets_arn=arn,
        llm_model="m1",
    )
    resolved = resolve_secrets(settings)
    assert resolved.llm_api_key is not None
    assert resolved.llm_api_key.get_secret_value() == "sk-from-secret"
    assert resolved.redis_url.get_secret_value() == "rediss://:pw@cache:6379/0"
    assert resolved.sandbox_bearer_token is None
    assert resolved.llm_model == "m1"
    assert "sk-from-secret" not in repr(resolved)


def test_the_secrets_read_are_not_logged_at_debug_level(
    dynamodb_server: DynamoDBServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A host logging at DEBUG (Lambda with its log level DEBUG) got the AWS SDK's line with
    # each response's body: the secrets in clear, read before they could be masked.
    stack = make_secret(
        dynamodb_server,
        "stack-secrets-debug",
        json.dumps({"llm_api_key": "sk-debug-9d8c7b", "redis_url": "rediss://:pw-debug-5a4@c:1/0"}),
    )
    agent = make_secret(dynamodb_server, "agent-secrets-debug", json.dumps({"MAP_KEY": "mk-3e2f1"}))
    monkeypatch.setenv("MAP_KEY", "stale")  # restored when the test ends
    settings = secrets_settings(dynamodb_server, secrets_arn=stack, agent_secrets_arn=agent)
    caplog.set_level(logging.DEBUG)
    resolved = resolve_secrets(settings)
    assert resolved.llm_api_key is not None
    assert resolved.llm_api_key.get_secret_value() == "sk-debug-9d8c7b"
    assert os.environ["MAP_KEY"] == "mk-3e2f1"
    assert any(record.name.startswith("botocore") for record in caplog.records)
    for secret in ("sk-debug-9d8c7b", "pw-debug-5a4", "mk-3e2f1"):
        assert secret not in caplog.text


def test_a_secret_that_is_not_a_json_object_is_a_configuration_error(
    dynamodb_server: DynamoDBServer,
) -> None:
    arn = make_secret(dynamodb_server, "stack-secrets-text", "just text")
    settings = secrets_settings(dynamodb_server, secrets_arn=arn)
    with pytest.raises(ConfigurationError, match="JSON object"):
        resolve_secrets(settings)


def test_a_missing_secret_is_a_configuration_error_naming_its_region(
    dynamodb_server: DynamoDBServer,
) -> None:
    # It was "secretsmanager is unavailable ... (ResourceNotFoundException)": an outage.
    settings = secrets_settings(
        dynamodb_server,
        agent_secrets_arn="arn:aws:secretsmanager:eu-west-1:123456789012:secret:nope-AbCdEf",
    )
    with pytest.raises(ConfigurationError) as refused:
        resolve_secrets(settings)
    assert str(refused.value) == (
        "cannot read the secret of AGENT_SECRETS_ARN: it does not exist in region eu-west-1 "
        "(ResourceNotFoundException): check the ARN and the function's role"
    )


def test_a_secret_in_another_region_is_read_in_the_region_its_arn_names(
    dynamodb_server: DynamoDBServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was read in the stack's region (AWS_REGION), where it does not exist.
    client = boto3.client(
        "secretsmanager", endpoint_url=dynamodb_server.endpoint_url, region_name="eu-west-1"
    )
    arn = client.create_secret(
        Name="agent-secrets-eu", SecretString=json.dumps({"EU_WEATHER_KEY": "wk-eu-7c1d"})
    )["ARN"]
    assert ":eu-west-1:" in arn and dynamodb_server.region != "eu-west-1"
    monkeypatch.setenv("EU_WEATHER_KEY", "stale")  # restored when the test ends
    assert export_agent_secrets(secrets_settings(dynamodb_server, agent_secrets_arn=arn)) == [
        "EU_WEATHER_KEY"
    ]
    assert os.environ["EU_WEATHER_KEY"] == "wk-eu-7c1d"


def test_a_secrets_manager_that_never_answers_fails_within_seconds_naming_the_setting() -> None:
    # A Secrets Manager accepting connections and never answering held the start ~300 s
    # (the AWS SDK's 60 s read timeout, 5 attempts): past Lambda's 10 s init phase.
    silent = socket.create_server(("127.0.0.1", 0))  # connections wait, never accepted
    with silent:
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        settings = load_settings(
            secrets_arn="arn:aws:secretsmanager:us-east-1:123456789012:secret:stack-AbCdEf",
            secrets_endpoint_url=endpoint,
        )
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as failed:
            resolve_secrets(settings)
        elapsed = time.monotonic() - started
    assert elapsed < 20, elapsed
    message = str(failed.value)
    assert message.startswith("secretsmanager is unavailable: cannot read the secret of ")
    assert f"SECRETS_ARN: Secrets Manager ({endpoint}) did not answer within 3 s" in message
    assert "stack-AbCdEf" not in message


def test_a_secrets_manager_that_cannot_be_reached_fails_naming_the_setting() -> None:
    unused = socket.create_server(("127.0.0.1", 0))
    endpoint = f"http://127.0.0.1:{unused.getsockname()[1]}"
    unused.close()  # nothing listens there: connections are refused
    settings = load_settings(agent_secrets_arn="my-agent-secrets", secrets_endpoint_url=endpoint)
    with pytest.raises(StoreUnavailableError) as failed:
        resolve_secrets(settings)
    assert str(failed.value) == (
        "secretsmanager is unavailable: cannot read the secret of AGENT_SECRETS_ARN: Secrets "
        f"Manager ({endpoint}) could not be reached in 2 attempts (EndpointConnectionError)"
    )


def test_a_binary_secret_is_a_configuration_error(dynamodb_server: DynamoDBServer) -> None:
    client = boto3.client(
        "secretsmanager",
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
    )
    arn = client.create_secret(Name="stack-secrets-binary", SecretBinary=b'{"llm_api_key": "k"}')[
        "ARN"
    ]
    settings = secrets_settings(dynamodb_server, secrets_arn=arn)
    with pytest.raises(ConfigurationError, match="JSON object"):
        resolve_secrets(settings)


def test_a_secret_without_aws_credentials_names_the_setting_and_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    # It said "secretsmanager is unavailable: NoCredentialsError".
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    settings = load_settings(secrets_arn="arn:aws:secretsmanager:us-east-1:1:secret:x")
    with pytest.raises(ConfigurationError, match="SECRETS_ARN names a secret, but no AWS"):
        resolve_secrets(settings)


def test_an_app_run_in_process_reads_the_secret_as_serve_does(
    dynamodb_server: DynamoDBServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # app.query() and AgentApp.run() read the environment alone: the LLM agent had no key.
    from agentscope_serverless.settings import get_settings

    arn = make_secret(
        dynamodb_server, "stack-secrets-in-process", json.dumps({"llm_api_key": "sk-in-process"})
    )
    monkeypatch.setenv("SECRETS_ARN", arn)
    monkeypatch.setenv("SECRETS_ENDPOINT_URL", dynamodb_server.endpoint_url)
    monkeypatch.setenv("AWS_REGION", dynamodb_server.region)
    get_settings.cache_clear()
    try:
        key = get_settings().llm_api_key
    finally:
        get_settings.cache_clear()
    assert key is not None and key.get_secret_value() == "sk-in-process"


def test_the_agents_own_secrets_are_its_environment_before_it_is_imported(
    dynamodb_server: DynamoDBServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from agentscope_serverless.http.lambda_handler import build_app

    # An agent reading its key at import, as agents do locally.
    (tmp_path / "weather_agent.py").write_text(
        "import os\n"
        "from agentscope_serverless.app import AgentApp\n"
        "KEY = os.environ['WEATHER_API_KEY']\n"
        "app = AgentApp(app_name='weather')\n"
        "@app.query(framework='text')\n"
        "async def query(self, msgs, **kwargs):\n"
        "    yield 'sunny'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    arn = make_secret(
        dynamodb_server,
        "agent-secrets-weather",
        json.dumps({"WEATHER_API_KEY": "wk-from-the-secret", "MAPS_TOKEN": "mt-1"}),
    )
    # Restored when the test ends; the secret replaces what the environment held.
    monkeypatch.setenv("WEATHER_API_KEY", "stale")
    monkeypatch.setenv("MAPS_TOKEN", "stale")
    monkeypatch.setenv("AGENT_SECRETS_ARN", arn)
    monkeypatch.setenv("SECRETS_ENDPOINT_URL", dynamodb_server.endpoint_url)
    monkeypatch.setenv("AWS_REGION", dynamodb_server.region)
    monkeypatch.setenv("AGENT_APP", "weather_agent:app")
    monkeypatch.delitem(sys.modules, "weather_agent", raising=False)
    build_app(("process",))
    assert sys.modules["weather_agent"].KEY == "wk-from-the-secret"
    assert os.environ["MAPS_TOKEN"] == "mt-1"


def test_an_agents_own_secret_quoted_by_its_error_reaches_neither_caller_nor_log(
    dynamodb_server: DynamoDBServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from agentscope_serverless.auth.file import FileKeyStore
    from agentscope_serverless.http.lambda_handler import make_handler
    from agentscope_serverless.log import logger
    from tests.support.http import issue_key
    from tests.support.lambda_runtime import function_url_event

    # An agent whose weather API refuses it, quoting the URL with its key, as clients do.
    (tmp_path / "refused_agent.py").write_text(
        "import os\n"
        "from agentscope_serverless.app import AgentApp\n"
        "app = AgentApp(app_name='refused')\n"
        "@app.query(framework='text')\n"
        "async def query(self, msgs, **kwargs):\n"
        "    key = os.environ['WEATHER_API_KEY']\n"
        "    raise RuntimeError(f'401 for https://weather.example/v1?key={key}')\n"
        "    yield ''\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    arn = make_secret(
        dynamodb_server,
        "agent-secrets-refused",
        json.dumps({"WEATHER_API_KEY": "wk-never-shown-4f1c"}),
    )
    keys = tmp_path / "keys.json"
    api_key = issue_key(FileKeyStore(keys), "weather-user")
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(keys))
    monkeypatch.setenv("AGENT_SECRETS_ARN", arn)
    monkeypatch.setenv("SECRETS_ENDPOINT_URL", dynamodb_server.endpoint_url)
    monkeypatch.setenv("AWS_REGION", dynamodb_server.region)
    monkeypatch.setenv("AGENT_APP", "refused_agent:app")
    monkeypatch.setenv("WEATHER_API_KEY", "")  # restored when the test ends
    monkeypatch.delitem(sys.modules, "refused_agent", raising=False)
    handler = make_handler(["process"])
    body = json.dumps({"input": [{"role": "user", "content": "Weather?"}], "stream": False})
    headers = {"authorization": f"Bearer {api_key}", "content-type": "application/json"}
    level = logger.level
    logger.setLevel(logging.ERROR)  # the agent's failure is logged with its traceback
    try:
        answer = handler(function_url_event("POST", "/process", headers=headers, body=body), None)
    finally:
        logger.setLevel(level)
    logged = capsys.readouterr().out
    assert os.environ["WEATHER_API_KEY"] == "wk-never-shown-4f1c"
    response = json.loads(answer["body"])
    assert response["status"] == "failed", response
    assert "weather.example" in response["error"]["message"]
    assert "wk-never-shown-4f1c" not in answer["body"]
    assert "weather.example" in logged and "wk-never-shown-4f1c" not in logged


def test_agent_secret_fields_lambda_reserves_are_refused_naming_them(
    dynamodb_server: DynamoDBServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials for another AWS account, put in the agent's secrets under the names
    Lambda gives the function's own, would become those of every store of the function."""
    fields = {"AWS_ACCESS_KEY_ID": "AKIA-other", "AWS_SECRET_ACCESS_KEY": "other-secret"}
    arn = make_secret(dynamodb_server, "agent-secrets-reserved", json.dumps(fields))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    settings = secrets_settings(dynamodb_server, agent_secrets_arn=arn)
    with pytest.raises(ConfigurationError) as refused:
        export_agent_secrets(settings)
    message = str(refused.value)
    assert "'AWS_ACCESS_KEY_ID'" in message and "'AWS_SECRET_ACCESS_KEY'" in message
    assert "Lambda" in message and "other-secret" not in message
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"


def test_agent_secret_fields_that_cannot_be_variables_are_refused_naming_them(
    dynamodb_server: DynamoDBServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = {"1BAD": "v1", "LLM_API_KEY": "sk-not-here", "PORT_NUMBER": 5, "GOOD_ONE": "v2"}
    arn = make_secret(dynamodb_server, "agent-secrets-bad", json.dumps(fields))
    monkeypatch.delenv("GOOD_ONE", raising=False)
    settings = secrets_settings(dynamodb_server, agent_secrets_arn=arn)
    with pytest.raises(ConfigurationError) as refused:
        export_agent_secrets(settings)
    message = str(refused.value)
    assert "'1BAD'" in message and "'LLM_API_KEY'" in message and "'PORT_NUMBER'" in message
    assert "sk-not-here" not in message and "GOOD_ONE" not in message
    assert "GOOD_ONE" not in os.environ  # nothing is put when a field is refused
    assert export_agent_secrets(load_settings(agent_secrets_arn=None)) == []


def test_the_agents_own_secrets_are_kept_out_of_run_errors_and_log_lines(
    dynamodb_server: DynamoDBServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from agentscope_serverless.http.lambda_handler import build_app
    from agentscope_serverless.log import logger
    from tests.support.http import bearer, issue_key, running

    # An agent whose failure quotes its key, as an HTTP client's error quotes a URL.
    (tmp_path / "quoting_agent.py").write_text(
        "import os\n"
        "from agentscope_serverless.app import AgentApp\n"
        "app = AgentApp(app_name='quoting')\n"
        "@app.query(framework='text')\n"
        "async def query(self, msgs, **kwargs):\n"
        "    yield 'checking'\n"
        "    raise RuntimeError('refused: ?appid=' + os.environ['FORECAST_KEY'])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    key = "fk-" + "0123456789abcdef"  # made here: a traceback quotes its source lines
    arn = make_secret(dynamodb_server, "agent-secrets-quoted", json.dumps({"FORECAST_KEY": key}))
    monkeypatch.setenv("FORECAST_KEY", "stale")  # restored when the test ends
    monkeypatch.setenv("AGENT_SECRETS_ARN", arn)
    monkeypatch.setenv("SECRETS_ENDPOINT_URL", dynamodb_server.endpoint_url)
    monkeypatch.setenv("AWS_REGION", dynamodb_server.region)
    monkeypatch.setenv("AGENT_APP", "quoting_agent:app")
    monkeypatch.delitem(sys.modules, "quoting_agent", raising=False)
    app = build_app(("process",))
    user_key = issue_key(app.state.context.key_store, "alice")
    level = logger.level
    logger.setLevel("ERROR")  # the tests log nothing below CRITICAL
    try:
        with running(app) as url:
            body = {"input": [{"role": "user", "content": "rain?"}], "stream": False}
            answer = httpx.post(f"{url}/process", json=body, headers=bearer(user_key))
    finally:
        logger.setLevel(level)
    logged = capfd.readouterr().out
    assert answer.json()["status"] == "failed"
    error = answer.json()["error"]
    assert error["message"] == "Unknown agent error: RuntimeError: refused: ?appid=***"
    assert "the agent failed" in logged and "RuntimeError" in logged
    assert key not in logged and key not in answer.text


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (
            {"LLM_API_KEY": "sk-hush-1", "REDIS_URL": "rediss://:hush@cache:6379"},
            "'LLM_API_KEY' (did you mean llm_api_key?), 'REDIS_URL' (did you mean redis_url?)",
        ),
        ({"llm_apikey": "sk-hush-1"}, "'llm_apikey' (did you mean llm_api_key?)"),
        ({"llm_api_key": "sk-hush-1", "weather_key": "hush"}, "'weather_key'"),
    ],
)
def test_stack_secret_fields_it_does_not_read_are_refused_naming_them_and_those_it_reads(
    dynamodb_server: DynamoDBServer, fields: dict[str, str], named: str
) -> None:
    # Taken, they were ignored without a word: the function ran without its key, or with
    # its stores in memory.
    arn = make_secret(dynamodb_server, f"stack-secrets-unknown-{len(named)}", json.dumps(fields))
    settings = secrets_settings(dynamodb_server, secrets_arn=arn)
    with pytest.raises(ConfigurationError) as refused:
        resolve_secrets(settings)
    message = str(refused.value)
    assert f"holds fields it does not read: {named}; " in message, message
    assert "it reads llm_api_key, sandbox_bearer_token, redis_url" in message
    assert "hush" not in message


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("llm_api_key", "sk-hush-1\n", "llm_api_key: its value begins or ends with white space"),
        ("sandbox_bearer_token", " hush-token", "sandbox_bearer_token: its value begins or"),
        ("redis_url", "cache-hush:6379", "redis_url: give a URL beginning with redis://"),
    ],
)
def test_a_stack_secret_field_with_a_value_its_setting_refuses_is_refused_saying_why(
    dynamodb_server: DynamoDBServer, field: str, value: str, says: str
) -> None:
    arn = make_secret(dynamodb_server, f"stack-secrets-bad-{field}", json.dumps({field: value}))
    settings = secrets_settings(dynamodb_server, secrets_arn=arn)
    with pytest.raises(ConfigurationError) as refused:
        resolve_secrets(settings)
    message = str(refused.value)
    assert message.startswith(f"the secret of SECRETS_ARN holds an invalid value for: {says}")
    assert "hush" not in message
