"""The OpenAPI document lists every answer of every route, and may be kept behind the key."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.http import create_app
from agentscope_serverless.http.function_app import create_function_app
from agentscope_serverless.settings import load_settings
from tests.conftest import PROJECT_ROOT
from tests.support.http import (
    Keys,
    assert_docs_run_only_their_pinned_scripts,
    bearer,
    running,
    user_message,
)
from tests.support.sandbox_server import RunningServer
from tests.support.slow_agent import app as slow_app

ERRORS = {"400", "401", "403", "404", "405", "408", "409", "413", "415", "422", "500", "503"}
# The headers the API's answers carry (each must be documented where it is sent).
HEADERS = (
    "X-Request-Id",
    "Cache-Control",
    "WWW-Authenticate",
    "Retry-After",
    "X-Should-Retry",
    "Idempotent-Replayed",
    "X-Run-Id",
    "X-Session-Id",
)
ERROR_BODY = "#/components/schemas/ErrorBody"
CHAT = "/compatible-mode/v1/chat/completions"
RESPONSES = "/compatible-mode/v1/responses"
STORED = "/compatible-mode/v1/responses/{response_id}"
# Keywords of pydantic's constraints that are no keywords of JSON Schema.
NOT_JSON_SCHEMA = {"ge", "gt", "le", "lt", "min_length", "max_length", "multiple_of"}


def assert_documented(document: dict[str, Any], path: str, response: httpx.Response) -> None:
    """``response`` (to a request of the operation at ``path``, as the document names it) is
    documented: its status, its media type, and each header it carries."""
    method = response.request.method.lower()
    responses = document["paths"][path][method]["responses"]
    status = str(response.status_code)
    assert status in responses, (method, path, status)
    answer = responses[status]
    media_type = response.headers.get("content-type", "").partition(";")[0]
    if media_type:
        assert media_type in answer.get("content", {}), (method, path, status, media_type)
    sent = {name for name in HEADERS if name in response.headers}
    documented = set(answer.get("headers", {}))
    assert sent <= documented, (method, path, status, sorted(sent - documented))


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def test_every_route_documents_its_errors_with_the_error_schema(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    document = client_for(keys.alice).get("/openapi.json").json()
    documented = [(p, m, o) for p, m, o in operations(document) if p != "/health"]
    assert len(documented) >= 18
    for path, method, operation in documented:
        responses = operation["responses"]
        assert set(responses) >= ERRORS, (method, path, sorted(responses))
        for status in ERRORS:
            content = responses[status]["content"]
            assert list(content) == ["application/json"], (method, path, status)
            # A2A's HTTP+JSON binding answers its own errors in its own shape too.
            schema = content["application/json"]["schema"]
            assert {"$ref": ERROR_BODY} in [schema, *schema.get("anyOf", [])], (path, status)
    error = document["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"code", "message", "type", "param"}


def test_idempotency_key_is_documented_on_the_writes_only(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    """Not on a read, nor on a search (a POST that reads: its key is not honoured)."""
    document = client_for(keys.alice).get("/openapi.json").json()
    reads = {("/memory/search", "post")}
    for path, method, operation in operations(document):
        if path == "/health":
            continue
        headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        write = method != "get" and (path, method) not in reads
        assert ("Idempotency-Key" in headers) is write, (method, path)
    assert reads <= {(path, method) for path, method, _ in operations(document)}


def test_the_answers_served_and_their_headers_are_documented(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    document = client.get("/openapi.json").json()
    run = {"input": [user_message("hello")], "stream": False}
    served = [
        ("/process", client.post("/process", json=run)),
        ("/process", client_for(None).post("/process", json=run)),
        ("/sessions/{session_id}", client.get("/sessions/nope")),
        ("/runs/{run_id}/events", client.get("/runs/x/events", params={"after": -2})),
    ]
    key = {"Idempotency-Key": uuid.uuid4().hex}
    for _ in range(2):
        served.append(("/process", client.post("/process", json=run, headers=key)))
    assert served[-1][1].headers["Idempotent-Replayed"] == "true"
    chat = {"messages": [{"role": "user", "content": "hello"}]}
    served.append(("/compatible-mode/v1/chat/completions", client.post(CHAT, json=chat)))
    created = client.post(RESPONSES, json={"input": "hello"})
    served.append((RESPONSES, created))
    response_id = created.json()["id"]
    served.append((STORED, client.get(f"{RESPONSES}/{response_id}")))
    with client.stream("GET", f"{RESPONSES}/{response_id}", params={"stream": True}) as events:
        served.append((STORED, events))
    served.append((STORED, client.get(f"{RESPONSES}/resp_missing")))
    served.append((STORED, client.delete(f"{RESPONSES}/resp_missing")))
    assert "X-Run-Id" in served[0][1].headers and "WWW-Authenticate" in served[1][1].headers
    for path, response in served:
        assert_documented(document, path, response)


def test_health_documents_the_errors_it_answers(
    client_for: Callable[..., httpx.Client],
) -> None:
    # It listed 200 and 503 only, while refusing what every route refuses, needing no key.
    client = client_for(None)
    document = client.get("/openapi.json").json()
    json_type = {"Content-Type": "application/json"}
    too_large = b"a" * (load_settings().max_request_bytes + 1)
    served = [
        client.get("/health?x=%FF"),
        client.request(
            "GET", "/health", content=b"xx", headers={**json_type, "Content-Encoding": "gzip"}
        ),
        client.request("GET", "/health", content=too_large, headers=json_type),
    ]
    assert [response.status_code for response in served] == [422, 415, 413]
    answers = document["paths"]["/health"]["get"]["responses"]
    for response in served:
        assert_documented(document, "/health", response)
        content = answers[str(response.status_code)]["content"]
        assert content["application/json"]["schema"] == {"$ref": ERROR_BODY}


def test_a_runs_events_are_documented_as_an_event_stream_only(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # Its 200 was documented as JSON too, which it never is.
    client = client_for(keys.alice)
    document = client.get("/openapi.json").json()
    run = client.post("/process", json={"input": [user_message("hello")], "stream": False})
    events = client.get(f"/runs/{run.headers['X-Run-Id']}/events")
    assert events.status_code == 200
    assert_documented(document, "/runs/{run_id}/events", events)
    answers = document["paths"]["/runs/{run_id}/events"]["get"]["responses"]
    # As /process's: a schema there is read (by schemathesis) as each event's.
    assert answers["200"]["content"] == {"text/event-stream": {}}
    assert list(answers["404"]["content"]) == ["application/json"]


@pytest.mark.parametrize(
    ("response_type", "media_type"),
    [("sse", "text/event-stream"), ("text", "text/plain"), ("json", "application/json")],
)
def test_a_served_function_documents_the_one_type_it_answers_in(
    response_type: str, media_type: str
) -> None:
    # Its success was documented as JSON whatever it answered in.
    keys = Keys.make()  # its own: the application stops its key store as it stops
    app = create_function_app(
        lambda body: ["a"],
        response_type=response_type,
        settings=load_settings(),
        key_store=keys.store,
    )
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
        document = client.get("/openapi.json").json()
        answer = client.post("/process", json={})
        refused = client.post(
            "/process", content=b"{", headers={"Content-Type": "application/json"}
        )
    assert (answer.status_code, refused.status_code) == (200, 422)
    answers = document["paths"]["/process"]["post"]["responses"]
    assert list(answers["200"]["content"]) == [media_type]
    assert_documented(document, "/process", answer)
    assert_documented(document, "/process", refused)


def test_the_a2a_routes_are_documented_behind_the_key(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    document = client.get("/openapi.json").json()
    call = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "nope"}}
    served = [
        ("/a2a", client_for(None).post("/a2a", json=call)),
        ("/a2a", client.post("/a2a", json=call, headers={"A2A-Version": "1.0"})),
        ("/a2a/{rest}", client.get("/a2a/tasks/nope")),
        ("/.well-known/agent-card.json", client.get("/.well-known/agent-card.json")),
    ]
    assert [response.status_code for _, response in served[:2]] == [401, 200]
    for path, response in served:
        assert_documented(document, path, response)
    operation = document["paths"]["/a2a"]["post"]
    assert operation["security"] == [{"APIKey": []}]
    assert "JSON-RPC" in operation["description"]
    assert operation["requestBody"]["required"] is True


def test_an_apps_streaming_endpoint_and_task_document_what_they_answer() -> None:
    keys = Keys.make()  # its own: the application stops its key store as it stops
    app = create_app(settings=load_settings(), agent_app=slow_app, key_store=keys.store)
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
        document = client.get("/openapi.json").json()
        refused = client.post("/ask-stream", json=[1])
        not_json = client.post("/ask-stream", content=b"x", headers={"Content-Type": "text/plain"})
        no_body = client.post("/jobs/double")
    assert [refused.status_code, not_json.status_code, no_body.status_code] == [422, 415, 422]
    assert_documented(document, "/ask-stream", refused)
    assert_documented(document, "/ask-stream", not_json)
    assert_documented(document, "/jobs/double", no_body)
    assert document["paths"]["/jobs/double"]["post"]["requestBody"]["required"] is True


def test_a_sandbox_server_at_capacity_is_a_documented_429(sandbox_server: RunningServer) -> None:
    keys = Keys.make()
    settings = load_settings(
        sandbox_base_url=sandbox_server.url,
        sandbox_bearer_token=sandbox_server.token,
        sandbox_max_per_user=1,
    )
    app = create_app(["sandbox"], settings=settings, key_store=keys.store)
    sessions = [f"full-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
        client.timeout = httpx.Timeout(30)
        document = client.get("/openapi.json").json()
        assert client.post(f"/sandboxes/{sessions[0]}").status_code == 200
        refused = client.post(f"/sandboxes/{sessions[1]}")
        assert client.delete(f"/sandboxes/{sessions[0]}").status_code == 200
    assert refused.status_code == 429 and "Retry-After" in refused.headers
    assert_documented(document, "/sandboxes/{session_id}", refused)


def test_error_detail_documents_every_field_an_error_carries(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    detail = client.get("/openapi.json").json()["components"]["schemas"]["ErrorDetail"]
    errors = [
        client.get("/sessions/nope").json()["error"],
        client.post("/process", json={"input": "hi"}).json()["error"],
        client.post(CHAT, json={"messages": []}).json()["error"],
    ]
    for error in errors:
        assert set(detail["required"]) <= set(error) <= set(detail["properties"]), error
        assert error["type"] in detail["properties"]["type"]["enum"]
    assert errors[1]["param"] == "input" and errors[0]["param"] is None, errors


def test_the_document_is_valid_openapi_its_schemas_of_json_schema_keywords(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    document = client_for(keys.alice).get("/openapi.json").json()
    pytest.importorskip("openapi_spec_validator").validate(document)

    def keywords(schema: Any) -> Iterator[str]:
        if isinstance(schema, list):
            for item in schema:
                yield from keywords(item)
        elif isinstance(schema, dict):
            for name, value in schema.items():
                yield name
                if name == "properties":  # field names, not keywords
                    for field in value.values():
                        yield from keywords(field)
                elif name not in ("examples", "example", "default", "const", "enum"):
                    yield from keywords(value)

    assert not NOT_JSON_SCHEMA & set(keywords(document))
    events = document["paths"]["/runs/{run_id}/events"]["get"]["parameters"]
    after = next(p for p in events if p["name"] == "after")["schema"]
    assert {"type": "integer", "minimum": -1} in after["anyOf"]


def test_ids_cursors_and_rounds_are_bounded_in_the_schema(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    paths = client_for(keys.alice).get("/openapi.json").json()["paths"]
    parameters = {p["name"]: p["schema"] for p in paths["/state/{session_id}"]["get"]["parameters"]}
    assert parameters["session_id"]["maxLength"] == 512 and "pattern" in parameters["session_id"]
    assert parameters["round_id"]["anyOf"][0]["maximum"] == 2**53 - 1
    listing = {p["name"]: p["schema"] for p in paths["/sessions"]["get"]["parameters"]}
    assert "pattern" in listing["cursor"]["anyOf"][0]


def test_the_schema_and_the_docs_can_require_a_key(keys: Keys) -> None:
    settings = load_settings(docs_require_key=True)
    app = create_app(settings=settings, agent_app=demo_app, key_store=keys.store)
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for path in ("/openapi.json", "/docs"):
            assert client.get(path).status_code == 401
            assert client.get(path, headers=bearer(keys.alice)).status_code == 200
        assert_docs_run_only_their_pinned_scripts(client.get("/docs", headers=bearer(keys.alice)))
        assert "/process" in client.get("/openapi.json", headers=bearer(keys.alice)).json()["paths"]


def test_the_schema_is_open_by_default(client_for: Callable[..., httpx.Client]) -> None:
    assert client_for(None).get("/openapi.json").status_code == 200


def request_schema(document: dict[str, Any], path: str) -> Draft202012Validator:
    """A validator of the JSON body ``POST path`` takes, as the document describes it."""
    registry = Registry().with_resource(
        "urn:openapi", Resource.from_contents(document, default_specification=DRAFT202012)
    )
    escaped = path.replace("~", "~0").replace("/", "~1")
    pointer = f"/paths/{escaped}/post/requestBody/content/application~1json/schema"
    return Draft202012Validator({"$ref": f"urn:openapi#{pointer}"}, registry=registry)


def test_a_message_whose_content_is_a_plain_string_is_a_body_the_schema_takes(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # The server took the README's bodies, the document allowed an array of parts or null
    # alone: a client generated from it could not send them.
    document = client_for(keys.alice).get("/openapi.json").json()
    readme = (PROJECT_ROOT / "README.md").read_text()
    processed = [json.loads(body) for body in re.findall(r"-d '(\{\"input\".*?\})'", readme)]
    assert processed
    said = [{"role": "user", "content": "I like tea"}]
    bodies = [
        *(("/process", body) for body in processed),
        ("/sessions/{session_id}/messages", {"messages": said}),
        ("/memory", {"messages": said}),
    ]
    for path, body in bodies:
        errors = [error.message for error in request_schema(document, path).iter_errors(body)]
        assert errors == [], (path, body)
    refused = request_schema(document, "/process").iter_errors({"input": [{"content": 5}]})
    assert [error.json_path for error in refused] == ["$.input[0].content"]
