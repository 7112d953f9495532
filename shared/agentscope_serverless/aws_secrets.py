"""Secrets from AWS Secrets Manager, read when a function first runs (never at import).

The SAM template keeps the stack's secrets in one secret holding a JSON object, and gives
each function its ARN in ``SECRETS_ARN``. Its non-empty fields fill the settings of the same
name (``llm_api_key``, ``sandbox_bearer_token``, ``redis_url``), so secrets never sit in
environment variables.

>>> resolve_secrets(Settings())  # without SECRETS_ARN the settings come back unchanged
Settings(...)                    # doctest: +SKIP
"""

from __future__ import annotations

import json
from typing import Any

from agentscope_serverless.errors import ConfigurationError, StoreUnavailableError
from agentscope_serverless.settings import Settings

SECRET_FIELDS = ("llm_api_key", "sandbox_bearer_token", "redis_url")


def fetch_secret_json(arn: str, *, region: str, endpoint_url: str | None = None) -> dict[str, Any]:
    """The JSON object stored in the secret ``arn``."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    # A session of its own: the credentials of the environment as it is now.
    session = boto3.session.Session()
    client = session.client("secretsmanager", region_name=region, endpoint_url=endpoint_url)
    try:
        raw = client.get_secret_value(SecretId=arn).get("SecretString")
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise StoreUnavailableError(
            "secretsmanager", f"cannot read the secret of SECRETS_ARN ({code})"
        ) from None
    except NoCredentialsError:
        raise ConfigurationError(
            "SECRETS_ARN names a secret, but no AWS credentials were found to read it: "
            "configure them (AWS_PROFILE, AWS_ACCESS_KEY_ID...), or unset SECRETS_ARN and "
            "give the settings in the environment for a local run"
        ) from None
    except BotoCoreError as exc:
        raise StoreUnavailableError(
            "secretsmanager", f"cannot read the secret of SECRETS_ARN ({type(exc).__name__})"
        ) from None
    if raw is None:  # a binary secret (SecretBinary)
        raise ConfigurationError("the secret of SECRETS_ARN is not a JSON object (it is binary)")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise ConfigurationError("the secret of SECRETS_ARN is not a JSON object") from None
    if not isinstance(value, dict):
        raise ConfigurationError("the secret of SECRETS_ARN is not a JSON object")
    return value


def resolve_secrets(settings: Settings) -> Settings:
    """``settings`` with the fields found in the ``SECRETS_ARN`` secret filled in."""
    if not settings.secrets_arn:
        return settings
    secret = fetch_secret_json(
        settings.secrets_arn,
        region=settings.aws_region,
        endpoint_url=settings.secrets_endpoint_url,
    )
    updates = {name: secret[name] for name in SECRET_FIELDS if secret.get(name)}
    if not updates:
        return settings
    # Validate the merged values like any other setting (types, SecretStr wrapping).
    merged = {**settings.model_dump(), **updates}
    try:
        return Settings.model_validate(merged)
    except ValueError:
        raise ConfigurationError(
            f"the secret of SECRETS_ARN holds an invalid value for: {', '.join(updates)}"
        ) from None


__all__ = ["SECRET_FIELDS", "fetch_secret_json", "resolve_secrets"]
