"""AUTH_MODE=iam: the caller's IAM identity from the Function URL request context is the user.

Buffered functions run under Mangum (the raw event reaches the app as ``scope["aws.event"]``);
the streaming one behind the Lambda Web Adapter (the request context arrives in the
``x-amzn-request-context`` header). Both paths are exercised here, and keys mode, like a
server not behind the adapter, is shown to ignore the header.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mangum import Mangum

from agentscope_serverless.http import create_app
from agentscope_serverless.http.lambda_handler import behind_web_adapter
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, running
from tests.support.lambda_runtime import function_url_event

ACCOUNT = "123456789012"
ALICE = f"arn:aws:iam::{ACCOUNT}:user/alice"
BOB = f"arn:aws:sts::{ACCOUNT}:assumed-role/Analyst/bob"


def iam(arn: str | None, caller_id: str = "AIDAEXAMPLE") -> dict[str, Any]:
    """The ``authorizer.iam`` block of a Function URL request context."""
    identity = {
        "accessKey": "AKIAEXAMPLE",
        "accountId": ACCOUNT,
        "callerId": caller_id,
        "userId": caller_id,
        "cognitoIdentity": None,
        "principalOrgId": None,
    }
    if arn is not None:
        identity["userArn"] = arn
    return identity


def context_header(identity: dict[str, Any] | None) -> dict[str, str]:
    """The header the Web Adapter sets: the whole request context as JSON."""
    context: dict[str, Any] = {"accountId": ACCOUNT, "requestId": "r1"}
    if identity is not None:
        context["authorizer"] = {"iam": identity}
    return {"x-amzn-request-context": json.dumps(context)}


class FunctionUrl:
    """A buffered function (Mangum) invoked in process with Function URL events."""

    def __init__(self) -> None:
        app = create_app(["sessions"], settings=load_settings(auth_mode="iam"))
        self.handler = Mangum(app, lifespan="auto")

    def call(
        self,
        method: str,
        path: str,
        identity: dict[str, Any] | None,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        all_headers = {"content-type": "application/json", **(headers or {})}
        path, _, query = path.partition("?")
        event = function_url_event(
            method,
            path,
            query=query,
            headers=all_headers,
            body=None if body is None else json.dumps(body),
            iam=identity,
        )
        if identity is None:
            event["requestContext"].pop("authorizer", None)
        result = self.handler(event, None)
        return result["statusCode"], json.loads(result["body"] or "null")


@pytest.fixture(scope="module")
def function_url() -> FunctionUrl:
    return FunctionUrl()


def test_an_iam_caller_acts_as_its_arn_under_mangum(function_url: FunctionUrl) -> None:
    status, created = function_url.call("POST", "/sessions", iam(ALICE), {"session_id": "trip"})
    assert status == 201
    assert created["user_id"] == ALICE
    status, listed = function_url.call("GET", "/sessions", iam(ALICE))
    assert (status, [s["id"] for s in listed["items"]]) == (200, ["trip"])


def test_another_iam_principal_does_not_see_the_sessions(function_url: FunctionUrl) -> None:
    function_url.call("POST", "/sessions", iam(ALICE), {"session_id": "private"})
    status, listed = function_url.call("GET", "/sessions", iam(BOB))
    assert (status, listed["items"]) == (200, [])
    status, _ = function_url.call("GET", "/sessions/private", iam(BOB))
    assert status == 404


def test_an_iam_caller_naming_another_user_gets_403(function_url: FunctionUrl) -> None:
    status, body = function_url.call("GET", "/sessions", iam(ALICE), headers={"X-User-Id": BOB})
    assert status == 403
    assert body["error"]["code"] == "PERMISSION_DENIED"
    status, _ = function_url.call("GET", f"/sessions?user_id={BOB}", iam(ALICE))
    assert status == 403


def test_without_an_iam_context_the_request_gets_401(function_url: FunctionUrl) -> None:
    status, body = function_url.call("GET", "/sessions", None)
    assert status == 401
    assert body["error"]["code"] == "UNAUTHENTICATED"


def test_a_context_header_never_replaces_the_lambda_event(function_url: FunctionUrl) -> None:
    forged = context_header(iam(ALICE))
    status, _ = function_url.call("GET", "/sessions", None, headers=forged)
    assert status == 401
    status, listed = function_url.call("GET", "/sessions", iam(BOB), headers=forged)
    assert status == 200 and all(s["user_id"] == BOB for s in listed["items"])


def test_without_a_user_arn_the_caller_id_is_the_user(function_url: FunctionUrl) -> None:
    identity = iam(None, caller_id="AROAEXAMPLE:carol")
    status, created = function_url.call("POST", "/sessions", identity, {"session_id": "c"})
    assert (status, created["user_id"]) == (201, "AROAEXAMPLE:carol")


# Every identity of a Cognito identity pool signs with the pool's role, under one session
# name: the same userArn, callerId and userId for all of them.
COGNITO_ROLE = (
    f"arn:aws:sts::{ACCOUNT}:assumed-role/Cognito_AppAuth_Role/CognitoIdentityCredentials"
)


def cognito(identity_id: str) -> dict[str, Any]:
    """The ``authorizer.iam`` block of a request signed with a Cognito identity's credentials."""
    identity = iam(COGNITO_ROLE, caller_id="AROAEXAMPLE:CognitoIdentityCredentials")
    identity["cognitoIdentity"] = {
        "amr": ["authenticated", "cognito-idp.us-east-1.amazonaws.com/us-east-1_pool"],
        "identityId": identity_id,
        "identityPoolId": "us-east-1:11111111-2222-3333-4444-555555555555",
    }
    return identity


def test_each_cognito_identity_is_a_user_of_its_own(function_url: FunctionUrl) -> None:
    dana, erin = (
        "us-east-1:aaaaaaaa-0000-0000-0000-000000000001",
        "us-east-1:bbbbbbbb-0000-0000-0000-000000000002",
    )
    status, created = function_url.call("POST", "/sessions", cognito(dana), {"session_id": "diary"})
    assert (status, created["user_id"]) == (201, dana)
    status, listed = function_url.call("GET", "/sessions", cognito(erin))
    assert (status, listed["items"]) == (200, [])
    status, _ = function_url.call("GET", "/sessions/diary", cognito(erin))
    assert status == 404


@pytest.fixture(scope="module")
def adapter_url() -> Iterator[str]:
    """The app as the streaming function serves it: uvicorn behind the Web Adapter."""
    app = behind_web_adapter(create_app(["sessions"], settings=load_settings(auth_mode="iam")))
    with running(app) as url:
        yield url


def test_the_web_adapter_header_carries_the_iam_identity(adapter_url: str) -> None:
    with httpx.Client(base_url=adapter_url, timeout=10) as client:
        alice = context_header(iam(ALICE))
        created = client.post("/sessions", json={"session_id": "notes"}, headers=alice)
        assert (created.status_code, created.json()["user_id"]) == (201, ALICE)
        mine = client.get("/sessions", headers=alice).json()["items"]
        assert [s["id"] for s in mine] == ["notes"]
        theirs = client.get("/sessions", headers=context_header(iam(BOB))).json()["items"]
        assert theirs == []
        naming_bob = {**alice, "X-User-Id": BOB}
        assert client.get("/sessions", headers=naming_bob).status_code == 403


@pytest.mark.parametrize(
    "headers",
    [
        {},
        context_header(None),
        {"x-amzn-request-context": "{not json"},
        {"x-amzn-request-context": json.dumps({"authorizer": {"iam": {"userArn": "  "}}})},
    ],
    ids=["no header", "no authorizer", "not json", "blank identity"],
)
def test_the_web_adapter_path_without_an_identity_gets_401(
    adapter_url: str, headers: dict[str, str]
) -> None:
    response = httpx.get(f"{adapter_url}/sessions", headers=headers, timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"


def test_a_server_not_behind_the_web_adapter_takes_no_identity_from_a_header() -> None:
    # Served by itself (./scripts/run, an archive's server), nothing replaces the header a
    # client sends: naming itself anyone with it must not make it that user.
    app = create_app(["sessions"], settings=load_settings(auth_mode="iam"))
    with running(app) as url:
        response = httpx.get(f"{url}/sessions", headers=context_header(iam(ALICE)), timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"


def test_iam_mode_needs_no_key_and_a_key_alone_is_not_enough(adapter_url: str, keys: Keys) -> None:
    response = httpx.get(f"{adapter_url}/sessions", headers=bearer(keys.alice), timeout=10)
    assert response.status_code == 401


def test_keys_mode_ignores_a_forged_request_context(demo_url: str, keys: Keys) -> None:
    forged = context_header(iam(ALICE))
    with httpx.Client(base_url=demo_url, timeout=10) as client:
        assert client.get("/sessions", headers=forged).status_code == 401
        as_bob = client.get("/sessions", headers={**forged, **bearer(keys.bob)})
        assert as_bob.status_code == 200
        assert all(s["user_id"] == "bob" for s in as_bob.json()["items"])
        created = client.post(
            "/sessions", json={"session_id": "forged"}, headers={**forged, **bearer(keys.bob)}
        )
        assert created.json()["user_id"] == "bob"


def test_keys_mode_ignores_the_lambda_event_identity(keys: Keys) -> None:
    app = create_app(["sessions"], settings=load_settings(), key_store=keys.store)
    handler = Mangum(app, lifespan="auto")
    event = function_url_event("GET", "/sessions", iam=iam(ALICE))
    assert handler(event, None)["statusCode"] == 401
    event = function_url_event("GET", "/sessions", iam=iam(ALICE), headers=bearer(keys.bob))
    result = handler(event, None)
    assert result["statusCode"] == 200
    assert all(s["user_id"] == "bob" for s in json.loads(result["body"])["items"])


def test_the_web_adapter_serves_an_api_gateway_stage_as_the_root_path(adapter_url: str) -> None:
    """The streaming function behind a REST API's stage: the adapter passes the path with
    the stage (``/prod/sessions``), or without it when told to leave it out. Every route
    under the stage was a 404 and the docs named ``/openapi.json`` outside it; now the
    routes see the path after the stage and the URLs given keep it, as for the buffered
    functions."""
    alice = iam(ALICE)

    def stage_headers(requested: str) -> dict[str, str]:
        context = {"accountId": ACCOUNT, "stage": "prod", "path": requested}
        return {"x-amzn-request-context": json.dumps({**context, "authorizer": {"iam": alice}})}

    with httpx.Client(base_url=adapter_url, timeout=10) as client:
        created = client.post(
            "/prod/sessions", json={"session_id": "staged"}, headers=stage_headers("/prod/sessions")
        )
        assert created.status_code == 201, created.text
        for path in ("/prod/sessions", "/sessions"):  # the stage kept, or left out
            listed = client.get(path, headers=stage_headers("/prod/sessions"))
            assert listed.status_code == 200, (path, listed.text)
            assert "staged" in [s["id"] for s in listed.json()["items"]]
        for path in ("/prod/docs", "/docs"):
            docs = client.get(path, headers=stage_headers("/prod/docs"))
            assert docs.status_code == 200, (path, docs.text)
            assert 'url: "/prod/openapi.json"' in docs.text
        # A path that only begins like the stage's name is not in it.
        other = client.get("/production/sessions", headers=stage_headers("/production/sessions"))
        assert other.status_code == 404
        # Without a stage in the request context nothing changes.
        assert client.get("/docs", headers=context_header(alice)).status_code == 200
        assert 'url: "/openapi.json"' in client.get("/docs", headers=context_header(alice)).text


@pytest.mark.parametrize("deadline", ["NaN", "Infinity", "-Infinity", "1e400", '"soon"', "true"])
def test_a_lambda_context_deadline_that_is_no_time_sets_none(deadline: str) -> None:
    """The Web Adapter's header with a deadline JSON reads as NaN gave a run's timer NaN (a
    500): a deadline that is not a finite number sets no time limit."""
    from agentscope_serverless.http.lambda_handler import _adapter_deadline

    header = f'{{"deadline": {deadline}}}'.encode()
    assert _adapter_deadline([(b"x-amzn-lambda-context", header)], 5.0) is None
    finite = _adapter_deadline([(b"x-amzn-lambda-context", b'{"deadline": 4102444800000}')], 5.0)
    assert finite == 4102444800.0 - 5.0
