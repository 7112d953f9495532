"""Secrets from AWS Secrets Manager, read when a function first runs (never at import).

The SAM template keeps the stack's secrets in one secret holding a JSON object, and gives
each function its ARN in ``SECRETS_ARN``. Its non-empty fields fill the settings of the same
name (``llm_api_key``, ``sandbox_bearer_token``, ``redis_url``), so secrets never sit in
the function's configuration, nor in its log lines (the AWS SDK logs each response's body at
DEBUG level: not a secret's).

The agent's own secrets (a weather service's API key...) are in a secret of their own, named
by ``AGENT_SECRETS_ARN`` (the template's ``AgentSecretsArn``): each of its fields becomes an
environment variable of the process as the application starts, before the agent is
imported, so the agent reads ``os.environ["WEATHER_API_KEY"]`` in the cloud as it does
locally (:func:`export_agent_secrets`); their values are kept out of log lines and of the
errors of failed runs, as the settings' secrets are.

>>> settings = Settings()  # without SECRETS_ARN the settings come back unchanged
>>> resolve_secrets(settings) is settings
True
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
from typing import Any

from pydantic import ValidationError

from agentscope_serverless.errors import ConfigurationError, StoreUnavailableError
from agentscope_serverless.log import redact, redact_aws_credentials
from agentscope_serverless.settings import Settings, closest_name, secret_values

SECRET_FIELDS = ("llm_api_key", "sandbox_bearer_token", "redis_url")
# What an environment variable may be named, here.
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# The variables Lambda sets itself and refuses in a function's configuration: the function's
# credentials, region, runtime API... (a field of these names would replace them).
LAMBDA_RESERVED_VARIABLES = frozenset(
    {
        "_HANDLER",
        "_X_AMZN_TRACE_ID",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "AWS_EXECUTION_ENV",
        "AWS_LAMBDA_FUNCTION_NAME",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
        "AWS_LAMBDA_FUNCTION_VERSION",
        "AWS_LAMBDA_INITIALIZATION_TYPE",
        "AWS_LAMBDA_LOG_GROUP_NAME",
        "AWS_LAMBDA_LOG_STREAM_NAME",
        "AWS_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_LAMBDA_RUNTIME_API",
        "LAMBDA_TASK_ROOT",
        "LAMBDA_RUNTIME_DIR",
    }
)


# Set while this context reads a secret: the AWS SDK logs each response's body at DEBUG level,
# which would put the secret's values in a log line, in clear, before they can be masked.
_READING_SECRET: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "reading_secret", default=False
)


class _WhileReadingSecrets(logging.Filter):
    """Drops the records of the AWS SDK's response parser while a secret is read."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _READING_SECRET.get()


_UNLOGGED_BODIES = _WhileReadingSecrets()


# How long reading a secret may take: Secrets Manager answers in well under a second, and a
# function reads its secrets as it starts (Lambda's init phase lasts at most 10 s). An endpoint
# that never answers, or cannot be reached, fails the start within about
# ``SECRETS_MAX_ATTEMPTS * (SECRETS_CONNECT_TIMEOUT_SECONDS or SECRETS_READ_TIMEOUT_SECONDS)``,
# not the AWS SDK's 5 attempts of 60 s each.
SECRETS_CONNECT_TIMEOUT_SECONDS = 2.0
SECRETS_READ_TIMEOUT_SECONDS = 3.0
SECRETS_MAX_ATTEMPTS = 2
# The errors of Secrets Manager that say the deployment is wrong (the ARN, the function's
# role, the key the secret is encrypted with), not that the service is down: what each means.
_MISCONFIGURED = {
    "ResourceNotFoundException": "it does not exist in region {region}",
    "AccessDeniedException": "access denied",
    "AccessDenied": "access denied",
    "DecryptionFailure": "it cannot be decrypted with its KMS key (access to the key denied?)",
    "InvalidRequestException": "the request was refused (is the secret scheduled for deletion?)",
    "InvalidParameterException": "its ARN or name is not valid",
}
# The region in a secret's ARN: arn:<partition>:secretsmanager:<region>:<account>:secret:<name>
_ARN_REGION = re.compile(r"arn:[a-z0-9-]+:secretsmanager:([a-z0-9-]+):")


def secret_region(arn: str, default: str) -> str:
    """The region the secret ``arn`` is in: the one its ARN names, else ``default`` (for a
    secret given by name).

    >>> secret_region("arn:aws:secretsmanager:eu-west-1:123456789012:secret:s-AbCdEf", "us-east-1")
    'eu-west-1'
    >>> secret_region("my-agent-secrets", "us-east-1")
    'us-east-1'
    """
    match = _ARN_REGION.match(arn)
    return match.group(1) if match else default


def fetch_secret_json(
    arn: str, *, region: str, endpoint_url: str | None = None, setting: str = "SECRETS_ARN"
) -> dict[str, Any]:
    """The JSON object stored in the secret ``arn`` (the value of ``setting``), read in the
    region its ARN names (``region`` for a secret given by name).

    Raises :class:`ConfigurationError` when the secret cannot be read for what the
    deployment says (no such secret, access denied, not a JSON object), and
    :class:`StoreUnavailableError` when Secrets Manager does not answer (within
    :data:`SECRETS_READ_TIMEOUT_SECONDS`, :data:`SECRETS_MAX_ATTEMPTS` times) or fails.
    """
    import boto3
    from botocore.config import Config
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    region = secret_region(arn, region)
    config = Config(
        connect_timeout=SECRETS_CONNECT_TIMEOUT_SECONDS,
        read_timeout=SECRETS_READ_TIMEOUT_SECONDS,
        retries={"total_max_attempts": SECRETS_MAX_ATTEMPTS, "mode": "standard"},
    )
    # A session of its own: the credentials of the environment as it is now.
    session = boto3.session.Session()
    client = session.client(
        "secretsmanager", region_name=region, endpoint_url=endpoint_url, config=config
    )
    logging.getLogger("botocore.parsers").addFilter(_UNLOGGED_BODIES)  # added once
    reading = _READING_SECRET.set(True)
    try:
        raw = client.get_secret_value(SecretId=arn).get("SecretString")
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        if code in _MISCONFIGURED:
            meaning = _MISCONFIGURED[code].format(region=region)
            raise ConfigurationError(
                f"cannot read the secret of {setting}: {meaning} ({code}): check the ARN "
                "and the function's role"
            ) from None
        raise StoreUnavailableError(
            "secretsmanager", f"cannot read the secret of {setting} ({code})"
        ) from None
    except NoCredentialsError:
        raise ConfigurationError(
            f"{setting} names a secret, but no AWS credentials were found to read it: "
            f"configure them (AWS_PROFILE, AWS_ACCESS_KEY_ID...), or unset {setting} and "
            "give its values in the environment for a local run"
        ) from None
    except (ConnectTimeoutError, EndpointConnectionError) as exc:
        where = endpoint_url or f"region {region}"
        raise StoreUnavailableError(
            "secretsmanager",
            f"cannot read the secret of {setting}: Secrets Manager ({where}) could not be "
            f"reached in {SECRETS_MAX_ATTEMPTS} attempts ({type(exc).__name__})",
        ) from None
    except ReadTimeoutError:
        where = endpoint_url or f"region {region}"
        raise StoreUnavailableError(
            "secretsmanager",
            f"cannot read the secret of {setting}: Secrets Manager ({where}) did not answer "
            f"within {SECRETS_READ_TIMEOUT_SECONDS:g} s, {SECRETS_MAX_ATTEMPTS} times "
            "(ReadTimeoutError)",
        ) from None
    except BotoCoreError as exc:
        raise StoreUnavailableError(
            "secretsmanager", f"cannot read the secret of {setting} ({type(exc).__name__})"
        ) from None
    finally:
        _READING_SECRET.reset(reading)
    if raw is None:  # a binary secret (SecretBinary)
        raise ConfigurationError(f"the secret of {setting} is not a JSON object (it is binary)")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise ConfigurationError(f"the secret of {setting} is not a JSON object") from None
    if not isinstance(value, dict):
        raise ConfigurationError(f"the secret of {setting} is not a JSON object")
    return value


class _Refusals:
    """How many times a store refused a credential of the settings in this process."""

    count = 0


def credentials_refused() -> None:
    """A store refused a credential of the settings (Redis the password of ``redis_url``):
    it may have been rotated since the secret was read (see
    :mod:`agentscope_serverless.http.lambda_handler`, which reads it again then)."""
    _Refusals.count += 1


def credential_refusals() -> int:
    """How many times a store refused a credential of the settings, in this process."""
    return _Refusals.count


def resolve_secrets(settings: Settings) -> Settings:
    """``settings`` with the fields found in the ``SECRETS_ARN`` secret filled in; the agent's
    own secrets (``AGENT_SECRETS_ARN``) are put in the environment first. Every secret of the
    process is kept out of log lines and error messages from now on, before the agent is
    imported: a module that raises as it is imported may quote one."""
    export_agent_secrets(settings)
    resolved = _with_stack_secrets(settings)
    redact(secret_values(resolved))
    redact_aws_credentials()
    return resolved


def _with_stack_secrets(settings: Settings) -> Settings:
    """``settings`` with the fields found in the ``SECRETS_ARN`` secret filled in."""
    if not settings.secrets_arn:
        return settings
    secret = fetch_secret_json(
        settings.secrets_arn,
        region=settings.aws_region,
        endpoint_url=settings.secrets_endpoint_url,
    )
    _refuse_unknown_fields(secret)
    updates = {name: secret[name] for name in SECRET_FIELDS if secret.get(name)}
    if not updates:
        return settings
    # Validate the merged values like any other setting (types, SecretStr wrapping).
    merged = {**settings.model_dump(), **updates}
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc']))}: {error['msg'].removeprefix('Value error, ')}"
            for error in exc.errors()
        )
        raise ConfigurationError(
            f"the secret of SECRETS_ARN holds an invalid value for: {problems}"
        ) from None


def _refuse_unknown_fields(secret: dict[str, Any]) -> None:
    """Raise :class:`ConfigurationError` naming the fields of the ``SECRETS_ARN`` secret that
    are none of :data:`SECRET_FIELDS` (``LLM_API_KEY``, ``llm_apikey``: each would be ignored,
    its setting left unset), with the field each is likely meant as."""
    unknown = sorted(name[:64] for name in secret if name not in SECRET_FIELDS)
    if not unknown:
        return
    named = []
    for name in unknown[:10]:
        meant = closest_name(name, SECRET_FIELDS)
        named.append(repr(name) + (f" (did you mean {meant}?)" if meant else ""))
    raise ConfigurationError(
        f"the secret of SECRETS_ARN holds fields it does not read: {', '.join(named)}; it "
        f"reads {', '.join(SECRET_FIELDS)} (the agent's own secrets go in AGENT_SECRETS_ARN's)"
    )


def export_agent_secrets(settings: Settings) -> list[str]:
    """Put each field of the ``AGENT_SECRETS_ARN`` secret in this process's environment (a
    field replaces a variable of its name) and return their names; nothing without it.

    A field must be named as an environment variable (letters, digits and ``_``, not first
    a digit) and hold text; it may not be named as a setting of this project (those go in
    the environment or the stack's secret), nor as a variable Lambda reserves
    (:data:`LAMBDA_RESERVED_VARIABLES`: the function's own credentials...): else nothing is
    put, and the error names the fields (never their values).
    """
    if not settings.agent_secrets_arn:
        return []
    secret = fetch_secret_json(
        settings.agent_secrets_arn,
        region=settings.aws_region,
        endpoint_url=settings.secrets_endpoint_url,
        setting="AGENT_SECRETS_ARN",
    )
    ours = {name.upper() for name in Settings.model_fields}
    bad = sorted(
        name[:64]
        for name, value in secret.items()
        if not _VARIABLE_NAME.fullmatch(name)
        or name.upper() in ours
        or name.upper() in LAMBDA_RESERVED_VARIABLES
        or not isinstance(value, str)
        or "\0" in value
    )
    if bad:
        raise ConfigurationError(
            "the secret of AGENT_SECRETS_ARN holds fields that cannot be the agent's "
            "environment variables (each is named with letters, digits and _, holds text, "
            "and is no setting of this project nor a variable Lambda reserves, as the "
            "function's own AWS credentials: give another account's under names of your "
            f"own, to your client): {', '.join(map(repr, bad[:10]))}"
        )
    os.environ.update(secret)
    # Kept out of log lines and error messages, as the settings' secrets are.
    redact(secret.values())
    return sorted(secret)


__all__ = [
    "LAMBDA_RESERVED_VARIABLES",
    "SECRET_FIELDS",
    "credential_refusals",
    "credentials_refused",
    "export_agent_secrets",
    "fetch_secret_json",
    "resolve_secrets",
    "secret_region",
]
