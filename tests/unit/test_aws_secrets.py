"""Secrets of the SAM stack, read from Secrets Manager (moto's server over HTTP)."""

from __future__ import annotations

import json

import boto3
import pytest

from agentscope_serverless.aws_secrets import resolve_secrets
from agentscope_serverless.errors import ConfigurationError, StoreUnavailableError
from agentscope_serverless.local_stack import DynamoDBServer
from agentscope_serverless.settings import load_settings


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
    settings = load_settings(
        secrets_arn=arn,
        secrets_endpoint_url=dynamodb_server.endpoint_url,
        aws_region=dynamodb_server.region,
        llm_model="m1",
    )
    resolved = resolve_secrets(settings)
    assert resolved.llm_api_key is not None
    assert resolved.llm_api_key.get_secret_value() == "sk-from-secret"
    assert resolved.redis_url.get_secret_value() == "rediss://:pw@cache:6379/0"
    assert resolved.sandbox_bearer_token is None
    assert resolved.llm_model == "m1"
    assert "sk-from-secret" not in repr(resolved)


def test_a_secret_that_is_not_a_json_object_is_a_configuration_error(
    dynamodb_server: DynamoDBServer,
) -> None:
    arn = make_secret(dynamodb_server, "stack-secrets-text", "just text")
    settings = load_settings(
        secrets_arn=arn,
        secrets_endpoint_url=dynamodb_server.endpoint_url,
        aws_region=dynamodb_server.region,
    )
    with pytest.raises(ConfigurationError, match="JSON object"):
        resolve_secrets(settings)


def test_a_missing_secret_is_a_store_error(dynamodb_server: DynamoDBServer) -> None:
    settings = load_settings(
        secrets_arn="arn:aws:secretsmanager:us-east-1:123456789012:secret:nope",
        secrets_endpoint_url=dynamodb_server.endpoint_url,
        aws_region=dynamodb_server.region,
    )
    with pytest.raises(StoreUnavailableError, match="secretsmanager"):
        resolve_secrets(settings)


def test_a_binary_secret_is_a_configuration_error(dynamodb_server: DynamoDBServer) -> None:
    client = boto3.client(
        "secretsmanager",
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
    )
    arn = client.create_secret(Name="stack-secrets-binary", SecretBinary=b'{"llm_api_key": "k"}')[
        "ARN"
    ]
    settings = load_settings(
        secrets_arn=arn,
        secrets_endpoint_url=dynamodb_server.endpoint_url,
        aws_region=dynamodb_server.region,
    )
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
