"""Keys for a deployed stack: made with the CLI in the DynamoDB key table, checked by the app.

moto's DynamoDB server stands in for AWS; the CLI finds the table through the same settings
a deployed function uses (``AUTH_KEYS_BACKEND=dynamodb``, ``AUTH_KEYS_TABLE``).
"""

from __future__ import annotations

import io
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import botocore.session
import httpx
import pytest
from typer.testing import CliRunner

from agentscope_serverless.cli import app as cli_app
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer
from agentscope_serverless.log import format_as_json
from agentscope_serverless.services._dynamodb import _session
from agentscope_serverless.settings import load_settings
from tests.auth.test_key_stores import new_api_keys_table
from tests.support.http import bearer, running

CACHE_SECONDS = 0.5


@pytest.fixture
def key_table(dynamodb_server: DynamoDBServer) -> Iterator[dict[str, str]]:
    """A fresh key table, and the environment that points the CLI and the app at it."""
    env = {
        "AUTH_KEYS_BACKEND": "dynamodb",
        "AUTH_KEYS_TABLE": new_api_keys_table(dynamodb_server),
        "DYNAMODB_ENDPOINT_URL": dynamodb_server.endpoint_url,
        "AWS_REGION": dynamodb_server.region,
        "AWS_ACCESS_KEY_ID": LOCAL_AWS_CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": LOCAL_AWS_CREDENTIALS["aws_secret_access_key"],
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        yield env


def cli(*args: str) -> str:
    result = CliRunner().invoke(cli_app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def created_key(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("ask_"))


def test_a_key_made_with_the_cli_works_until_it_is_revoked(key_table: dict[str, str]) -> None:
    output = cli("keys", "create", "--user", "alice")
    assert key_table["AUTH_KEYS_TABLE"] in output
    key = created_key(output)
    key_id = key.split("_")[1]
    settings = load_settings(auth_keys_cache_seconds=CACHE_SECONDS)
    with (
        running(create_app(["sessions"], settings=settings)) as url,
        httpx.Client(base_url=url, headers=bearer(key), timeout=10) as client,
    ):
        assert client.post("/sessions", json={"session_id": "s1"}).status_code in (200, 201)
        assert [s["id"] for s in client.get("/sessions").json()["items"]] == ["s1"]
        assert client.get("/sessions", headers={"X-User-Id": "bob"}).status_code == 403
        listed = cli("keys", "list")
        assert key_id in listed and "alice" in listed and "ask_" not in listed

        cli("keys", "revoke", key_id)
        assert "revoked" in cli("keys", "list")
        time.sleep(CACHE_SECONDS + 0.1)
        refused = client.get("/sessions")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "UNAUTHENTICATED"


def test_the_table_option_picks_the_key_table(
    dynamodb_server: DynamoDBServer, key_table: dict[str, str]
) -> None:
    other = new_api_keys_table(dynamodb_server)
    key = created_key(cli("keys", "create", "--service", "--table", other))
    assert key.split("_")[1] in cli("keys", "list", "--table", other)
    assert key.split("_")[1] not in cli("keys", "list")


def test_a_malformed_key_item_is_named_while_the_other_keys_work(
    dynamodb_server: DynamoDBServer, key_table: dict[str, str]
) -> None:
    # keys list said "dynamodb is unavailable: the key table holds a malformed item", the
    # table reachable and the item not named.
    good = created_key(cli("keys", "create", "--user", "alice"))
    bad = created_key(cli("keys", "create", "--user", "bob"))
    bad_id = bad.split("_")[1]
    client: Any = botocore.session.get_session().create_client(
        "dynamodb", endpoint_url=dynamodb_server.endpoint_url, region_name=dynamodb_server.region,
        **LOCAL_AWS_CREDENTIALS,
    )  # fmt: skip
    client.update_item(
        TableName=key_table["AUTH_KEYS_TABLE"],
        Key={"key_id": {"S": bad_id}},
        UpdateExpression="SET kind = :kind",
        ExpressionAttributeValues={":kind": {"S": "admin"}},
    )
    malformed = f"key table is unavailable: it holds a malformed item, key_id {bad_id} (kind: "
    listed = CliRunner().invoke(cli_app, ["keys", "list"])
    assert listed.exit_code == 1
    assert f"error: {malformed}" in listed.output and bad.split("_", 2)[2] not in listed.output
    with running(create_app(["sessions"], settings=load_settings())) as url:
        assert httpx.get(f"{url}/sessions", headers=bearer(good), timeout=10).status_code == 200
        refused = httpx.get(f"{url}/sessions", headers=bearer(bad), timeout=10)
    assert refused.status_code == 503
    assert refused.json()["error"]["message"].startswith(malformed)


def test_the_aws_sdks_debug_lines_mask_the_functions_aws_credentials(
    key_table: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function logging at DEBUG (Lambda's log level) got botocore's lines of each request
    it signs, whose headers carry the role's session token, as they were."""
    token = f"IQoJb3JpZ2luX2VjE{uuid.uuid4().hex}{uuid.uuid4().hex}"
    secret_key = f"wJalrXUtnFEMI{uuid.uuid4().hex}"
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret_key)
    _session.cache_clear()  # a process's AWS session keeps the credentials it read first
    key = created_key(cli("keys", "create", "--user", "alice"))
    captured = io.StringIO()
    handler = logging.StreamHandler(captured)  # the host's (Lambda's) handler of the root
    root = logging.getLogger()
    root.addHandler(handler)
    for name in ("botocore", "aiobotocore"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.DEBUG)
    for name, child in logging.root.manager.loggerDict.items():
        # Loggers an earlier logging set-up disabled (uvicorn's, in a test before) log again.
        if name.startswith(("botocore", "aiobotocore")) and isinstance(child, logging.Logger):
            monkeypatch.setattr(child, "disabled", False)
    try:
        format_as_json()
        with (
            running(create_app(["sessions"], settings=load_settings())) as url,
            httpx.Client(base_url=url, headers=bearer(key), timeout=10) as client,
        ):
            assert client.get("/sessions").status_code == 200
    finally:
        root.removeHandler(handler)
    text = captured.getvalue()
    assert "x-amz-security-token" in text.lower()  # the signed requests' headers were logged
    assert token not in text and secret_key not in text
    assert "***" in text
