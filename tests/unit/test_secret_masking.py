"""The agent's secrets are masked in every form an error or a log line quotes them (as they
are, as ``repr()`` writes them, JSON-escaped), and masking keeps each log line JSON
(Secrets Manager from moto's server over HTTP, the app served by uvicorn)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import httpx
import pytest

from agentscope_serverless.local_stack import DynamoDBServer

# A client's private key of three lines, a password holding a backslash, one holding a tab:
# repr() writes them with \n, \\ and \t, not as they are.
PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
SECRETS = {
    "DB_CLIENT_KEY": PEM,
    "DB_PASSWORD": r"Tr0ub4dor\&3-x9",
    "SMTP_PASSWORD": "tab\tsecret99",
}
# What gives each away, whichever form it is quoted in.
GIVEAWAYS = ("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", "Tr0ub4dor", "secret99")


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


def test_secrets_quoted_by_repr_reach_neither_a_failed_runs_stream_nor_the_log(
    dynamodb_server: DynamoDBServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from agentscope_serverless.http.lambda_handler import build_app
    from agentscope_serverless.log import logger
    from tests.support.http import bearer, issue_key, running

    # An agent quoting its secrets as errors do: with !r, and in a dict printed.
    (tmp_path / "repr_agent.py").write_text(
        "import logging, os\n"
        "from agentscope_serverless.app import AgentApp\n"
        "app = AgentApp(app_name='repr')\n"
        "@app.query(framework='text')\n"
        "async def query(self, msgs, **kwargs):\n"
        "    yield 'connecting'\n"
        "    config = {'password': os.environ['DB_PASSWORD']}\n"
        "    logging.getLogger('agentscope_serverless.repr_agent').error(\n"
        "        'smtp refused %r with %s', os.environ['SMTP_PASSWORD'], config)\n"
        "    key = os.environ['DB_CLIENT_KEY']\n"
        "    raise ValueError(f'could not load the client key {key!r} for {config}')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    arn = make_secret(dynamodb_server, "agent-secrets-repr", json.dumps(SECRETS))
    for name in SECRETS:
        monkeypatch.setenv(name, "stale")  # restored when the test ends
    monkeypatch.setenv("AGENT_SECRETS_ARN", arn)
    monkeypatch.setenv("SECRETS_ENDPOINT_URL", dynamodb_server.endpoint_url)
    monkeypatch.setenv("AWS_REGION", dynamodb_server.region)
    monkeypatch.setenv("AGENT_APP", "repr_agent:app")
    monkeypatch.delitem(sys.modules, "repr_agent", raising=False)
    app = build_app(("process",))
    assert os.environ["DB_CLIENT_KEY"] == PEM
    user_key = issue_key(app.state.context.key_store, "alice")
    level = logger.level
    logger.setLevel("ERROR")  # the tests log nothing below CRITICAL
    try:
        with running(app) as url:
            body = {"input": [{"role": "user", "content": "connect"}], "stream": True}
            with httpx.stream(
                "POST", f"{url}/process", json=body, headers=bearer(user_key), timeout=30
            ) as answer:
                streamed = answer.read().decode()
    finally:
        logger.setLevel(level)
    logged = capfd.readouterr().out
    failed = [
        json.loads(line.removeprefix("data: "))
        for line in streamed.splitlines()
        if line.startswith("data: ") and '"failed"' in line
    ]
    assert failed, streamed
    assert failed[-1]["error"]["message"] == (
        "Unknown agent error: ValueError: could not load the client key '***' for "
        "{'password': '***'}"
    )
    assert "smtp refused '***' with {'password': '***'}" in logged
    assert "could not load the client key '***'" in logged
    for giveaway in GIVEAWAYS:
        assert giveaway not in streamed, giveaway
        assert giveaway not in logged, giveaway


# Logs lines as an agent does, its secrets put in the environment (in a process of its own:
# the values masked, "true" and "5432", would be masked in every later test's lines).
_FLAG_SECRETS_SCRIPT = """
import logging, sys
from agentscope_serverless.aws_secrets import resolve_secrets
from agentscope_serverless.log import format_as_json, logger
from agentscope_serverless.settings import load_settings

resolve_secrets(load_settings())
logging.basicConfig(stream=sys.stdout, level=logging.INFO)
format_as_json()
agent = logging.getLogger("myagent")
agent.warning("db connect", extra={"tls": True, "port": 5432, "retries": [5432, 1, False]})
agent.warning("tls is true, port 5432", extra={"timeout": 54321, "ratio": 0.5432})
logger.error("connect %r failed", {"tls": "true", "port": "5432", "pw": "hunter2-long"})
logger.error("nothing secret", extra={"attempt": 1, "ok": None, "tls": False})
"""


def test_secret_values_that_are_json_values_leave_every_log_line_json(
    dynamodb_server: DynamoDBServer, tmp_path: Path
) -> None:
    # "tls":true became "tls":***: CloudWatch Logs Insights could not read the line.
    arn = make_secret(
        dynamodb_server,
        "agent-secrets-flags",
        json.dumps({"DB_USE_TLS": "true", "DB_PORT": "5432", "DB_PASSWORD": "hunter2-long"}),
    )
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "AGENT_SECRETS_ARN": arn,
        "SECRETS_ENDPOINT_URL": dynamodb_server.endpoint_url,
        "AWS_REGION": dynamodb_server.region,
    }
    environment.pop("LOG_LEVEL", None)
    environment.pop("POWERTOOLS_LOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-c", _FLAG_SECRETS_SCRIPT],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]  # each one JSON
    assert len(lines) == 4, done.stdout
    first, second, third, fourth = lines
    assert (first["tls"], first["port"], first["retries"]) == ("***", "***", ["***", 1, False])
    assert second["message"] == "tls is ***, port ***"
    assert (second["timeout"], second["ratio"]) == ("***", "***")  # they hold 5432
    assert third["message"] == "connect {'tls': '***', 'port': '***', 'pw': '***'} failed"
    assert (fourth["attempt"], fourth["ok"], fourth["tls"]) == (1, None, False)
    assert "hunter2-long" not in done.stdout and "5432" not in done.stdout
