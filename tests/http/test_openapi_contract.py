"""The OpenAPI document lists every answer of every route, and may be kept behind the key."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.http import create_app
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, assert_docs_run_only_their_pinned_scripts, bearer, running

ERRORS = {"400", "401", "403", "404", "405", "408", "409", "413", "415", "422", "500", "503"}


def test_every_route_documents_its_errors_with_the_error_schema(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    document = client_for(keys.alice).get("/openapi.json").json()
    operations = [
        (path, method, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if path != "/health"
    ]
    assert len(operations) >= 18
    for path, method, operation in operations:
        responses = operation["responses"]
        assert set(responses) >= ERRORS, (method, path, sorted(responses))
        schema = responses["422"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorBody"}
        headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        assert "Idempotency-Key" in headers, (method, path)
    error = document["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"code", "message"}


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
