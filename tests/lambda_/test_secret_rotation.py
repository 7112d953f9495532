"""A warm function, buffered or streaming, takes up a Redis password rotated in the stack's
secret (``SECRETS_ARN``, moto's Secrets Manager over HTTP) and on the server (a real
redis-server, its password changed with ``CONFIG SET requirepass``): the secret was read
once, at the first request, and every later one answered 503 until a cold start."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from redis import Redis

from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.http import lambda_handler
from agentscope_serverless.http.lambda_handler import (
    LambdaHandler,
    build_web_adapter_app,
    make_handler,
)
from agentscope_serverless.local_stack import DynamoDBServer, RedisServer
from agentscope_serverless.log import logger
from tests.support.http import bearer, issue_key, parse_sse, running, text_of, user_message
from tests.support.lambda_runtime import function_url_event
from tests.support.slow_agent import PIECES

PASSWORDS = ("Old-Pa55-1111", "New-Pa55-2222", "Next-Pa55-3333")


class Stack:
    """The secret and the Redis server of a stack, whose password is rotated."""

    def __init__(self, redis: RedisServer, dynamodb: DynamoDBServer) -> None:
        self.redis = redis
        self.password = redis.password or ""
        self.secrets = boto3.client(
            "secretsmanager",
            endpoint_url=dynamodb.endpoint_url,
            region_name=dynamodb.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        name = f"rotated-{redis.port}"
        self.arn: str = self.secrets.create_secret(Name=name, SecretString=self._value())["ARN"]

    def _value(self, password: str | None = None) -> str:
        url = f"redis://:{password or self.password}@127.0.0.1:{self.redis.port}/0"
        return json.dumps({"redis_url": url})

    def put_secret(self, password: str) -> None:
        self.secrets.put_secret_value(SecretId=self.arn, SecretString=self._value(password))

    def set_server_password(self, password: str) -> None:
        """As a rotation does: the connections made with the old password are closed."""
        with Redis(port=self.redis.port, password=self.password) as client:
            client.config_set("requirepass", password)
        with Redis(port=self.redis.port, password=password) as client:
            client.client_kill_filter(_type="normal", skipme=True)
        self.password = password


def create_session(handler: LambdaHandler, key: str) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    response: dict[str, Any] = handler(
        function_url_event("POST", "/sessions", headers=headers, body="{}"), None
    )
    return response


def test_a_warm_function_reads_the_secret_again_once_redis_refuses_its_password(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    dynamodb_server: DynamoDBServer,
    capfd: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    keys_file = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys_file), "rotating-user")
    with RedisServer(password=PASSWORDS[0]) as redis:
        stack = Stack(redis, dynamodb_server)
        for name, value in {
            "AUTH_KEYS_BACKEND": "file",
            "AUTH_KEYS_FILE": str(keys_file),
            "SESSION_HISTORY_BACKEND": "redis",
            "SECRETS_ARN": stack.arn,
            "SECRETS_ENDPOINT_URL": dynamodb_server.endpoint_url,
            "AWS_REGION": dynamodb_server.region,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }.items():
            monkeypatch.setenv(name, value)
        level = logger.level
        logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
        # setLevel, not the attribute: it also forgets what was decided at the other level.
        request.addfinalizer(lambda: logger.setLevel(level))
        handler = make_handler(["sessions"])
        assert create_session(handler, key)["statusCode"] == 201

        # Rotated: the secret first, then the server.
        stack.put_secret(PASSWORDS[1])
        stack.set_server_password(PASSWORDS[1])
        refused = create_session(handler, key)
        assert refused["statusCode"] == 503
        assert "authentication failed" in json.loads(refused["body"])["error"]["message"]
        answers = [refused]
        # The next invocation starts again with the secret read anew.
        answers.append(create_session(handler, key))
        assert answers[-1]["statusCode"] == 201, answers[-1]

        # The server's password changed, the secret not yet: refused, and the secret is not
        # read again within RESTART_SECONDS, however many invocations are refused.
        stack.set_server_password(PASSWORDS[2])
        answers.append(create_session(handler, key))
        stack.put_secret(PASSWORDS[2])
        answers += [create_session(handler, key), create_session(handler, key)]
        assert [answer["statusCode"] for answer in answers[-3:]] == [503, 503, 503]
        # Once that time is over, a refusal makes the next invocation read it again.
        monkeypatch.setattr(lambda_handler, "RESTART_SECONDS", 0.0)
        answers.append(create_session(handler, key))
        answers.append(create_session(handler, key))
        assert [answer["statusCode"] for answer in answers[-2:]] == [503, 201]

    out, err = capfd.readouterr()
    assert "reads the secret again" in out
    seen = out + err + "".join(json.dumps(answer) for answer in answers)
    assert not [password for password in PASSWORDS if password in seen]


def test_a_warm_streaming_function_reads_the_secret_again_its_runs_in_flight_going_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    dynamodb_server: DynamoDBServer,
    capfd: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    keys_file = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys_file), "rotating-user")
    with RedisServer(password=PASSWORDS[0]) as redis:
        stack = Stack(redis, dynamodb_server)
        for name, value in {
            "AUTH_KEYS_BACKEND": "file",
            "AUTH_KEYS_FILE": str(keys_file),
            "SESSION_HISTORY_BACKEND": "redis",
            "RUNS_BACKEND": "in_memory",
            "AGENT_APP": "tests.support.slow_agent:app",
            "SECRETS_ARN": stack.arn,
            "SECRETS_ENDPOINT_URL": dynamodb_server.endpoint_url,
            "AWS_REGION": dynamodb_server.region,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }.items():
            monkeypatch.setenv(name, value)
        level = logger.level
        logger.setLevel("WARNING")
        request.addfinalizer(lambda: logger.setLevel(level))
        with (
            running(build_web_adapter_app(["process", "sessions"])) as url,
            httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client,
        ):
            created = client.post("/sessions", json={})
            assert created.status_code == 201, created.text
            # A run in flight (5 s) as the password is rotated, the secret first.
            began = threading.Event()
            lines: list[str] = []

            def run() -> None:
                body = {"input": [user_message("hi")], "session_id": created.json()["id"]}
                with client.stream("POST", "/process", json=body) as response:
                    for line in response.iter_lines():
                        lines.append(line)
                        began.set()

            in_flight = threading.Thread(target=run)
            in_flight.start()
            assert began.wait(10)
            stack.put_secret(PASSWORDS[1])
            stack.set_server_password(PASSWORDS[1])
            answers = [client.post("/sessions", json={})]
            assert answers[-1].status_code == 503
            assert "authentication failed" in answers[-1].json()["error"]["message"]
            # The next request is served by services started again with the secret read
            # anew, while the run goes on with its own.
            answers.append(client.post("/sessions", json={}))
            assert answers[-1].status_code == 201, answers[-1].text
            assert in_flight.is_alive()
            in_flight.join(30)
            # Its services were not closed under it: it ran to its end, where storing its
            # turn with them (the old password) was refused.
            events = parse_sse(lines).data
            assert text_of(events) == "".join(f"piece {i}. " for i in range(PIECES))
            assert events[-1]["status"] == "failed", events[-1]
            assert events[-1]["error"]["code"] == "STORE_UNAVAILABLE"

            # Refused again (the secret not yet changed): not read again within
            # RESTART_SECONDS.
            stack.set_server_password(PASSWORDS[2])
            stack.put_secret(PASSWORDS[2])
            answers += [client.post("/sessions", json={}), client.post("/sessions", json={})]
            assert [answer.status_code for answer in answers[-2:]] == [503, 503]

    out, err = capfd.readouterr()
    assert "reads the secret again" in out
    assert "the services did not stop" not in out
    seen = out + err + "".join(answer.text for answer in answers) + "\n".join(lines)
    assert not [password for password in PASSWORDS if password in seen]
