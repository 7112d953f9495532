"""The process function with the LLM agent gets its API key from the stack's secret.

As on AWS: the API key is not in the function's environment, only in the Secrets Manager
secret that ``SECRETS_ARN`` names (moto's server over HTTP); the built function runs under
the runtime interface client and calls a scripted OpenAI-compatible server, which records the
``Authorization`` header it receives.
"""

from __future__ import annotations

import json

import boto3
import pytest

from agentscope_serverless.local_stack import DynamoDBServer
from tests.http.test_llm_agent import ANSWER, ScriptedLLM
from tests.lambda_.test_functions import StartFunction, sse_events
from tests.support.http import running

pytestmark = pytest.mark.timeout(300)

SECRET_KEY = "sk-from-the-secret-7f3a"


def stack_secret(server: DynamoDBServer, value: dict[str, str]) -> str:
    client = boto3.client(
        "secretsmanager",
        endpoint_url=server.endpoint_url,
        region_name=server.region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    name = f"stack-secrets-{len(json.dumps(value))}-llm"
    arn: str = client.create_secret(Name=name, SecretString=json.dumps(value))["ARN"]
    return arn


def test_the_llm_agent_calls_the_chat_api_with_the_secrets_key(
    start_function: StartFunction, api_key: str, dynamodb_server: DynamoDBServer
) -> None:
    llm = ScriptedLLM([ANSWER])
    arn = stack_secret(
        dynamodb_server,
        {"llm_api_key": SECRET_KEY, "sandbox_bearer_token": "", "redis_url": ""},
    )
    with running(llm.app) as llm_url:
        function = start_function(
            "ProcessFunction",
            AGENT_APP="agentscope_serverless.agents.llm:app",
            LLM_BASE_URL=f"{llm_url}/v1",
            LLM_MODEL="scripted",
            SECRETS_ARN=arn,
            SECRETS_ENDPOINT_URL=dynamodb_server.endpoint_url,
        )
        status, _, body, _ = function.request(
            "POST",
            "/process",
            key=api_key,
            body={"input": [{"role": "user", "content": "Weather?"}], "session_id": "llm-secret"},
        )
    assert status == 200, body
    events = sse_events(body)
    assert events[-1]["status"] == "completed", events[-1]
    assert "It is sunny in Paris." in body.decode()
    assert [r["authorization"] for r in llm.requests] == [f"Bearer {SECRET_KEY}"]
    assert SECRET_KEY not in body.decode()
