"""The checks of routes a user adds (to ``app.get_fastapi_app()``, or with ``@app.endpoint``):
a body is checked as the route may read it, whatever its declared type; a user named by a
number or a form field is a user named; a service key's keyed request to them runs once; a
replay is the first answer, headers and all; a body the route fails to parse as JSON is 422."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, File, Form, Request, Response, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.http import create_app, public
from agentscope_serverless.http.lambda_handler import make_handler
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, issue_key, running
from tests.support.lambda_runtime import function_url_event


def _agent(name: str = "guarded") -> AgentApp:
    agent = AgentApp(app_name=name)

    @agent.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> Any:
        yield "hello"

    return agent


class Order(BaseModel):
    user_id: int
    item: str = ""


class Line(BaseModel):
    user_id: int | None = None
    item: str = ""


def _app(keys: Keys) -> FastAPI:
    """An app with routes of its own: added ones reading their body in several ways, and
    ``@app.endpoint`` ones."""
    agent = _agent()

    @agent.endpoint("/ep/notes", methods=["POST"])
    async def ep_notes(request: Request) -> dict[str, Any]:
        return {"stored_for": (await request.json()).get("user_id")}

    @agent.endpoint("/ep/form", methods=["POST"])
    async def ep_form(note: str = Form("")) -> dict[str, Any]:
        return {"note": note}

    @agent.endpoint("/ep/upload", methods=["POST"])
    async def ep_upload(
        upload: UploadFile, raw: bytes = File(b""), note: str = Form("")
    ) -> dict[str, Any]:
        return {"name": upload.filename, "size": len(await upload.read()) + len(raw), "note": note}

    @agent.endpoint("/ep/batch", methods=["POST"])
    async def ep_batch(lines: list[Line]) -> dict[str, Any]:
        return {"line_users": [line.user_id for line in lines]}

    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    @web.post("/notes")
    async def notes(request: Request) -> dict[str, Any]:
        return {"stored_for": (await request.json()).get("user_id")}

    @web.post("/orders")
    async def orders(order: Order) -> dict[str, Any]:
        return {"acting_for": order.user_id}

    @web.post("/form")
    async def form(user_id: str = Form("")) -> dict[str, Any]:
        return {"stored_for": user_id}

    @web.post("/rawform")
    async def rawform(request: Request) -> dict[str, Any]:
        return {"stored_for": (await request.form()).getlist("user_id")}

    @web.post("/upload")
    async def upload(request: Request) -> dict[str, Any]:
        return {"size": len(await request.body())}

    @web.post("/raw")
    async def raw(request: Request) -> dict[str, Any]:
        return {"size": len(await request.body())}

    @web.post("/hooks/in")
    @public
    async def hook(request: Request) -> dict[str, Any]:
        return {"got": await request.json()}

    return create_app(settings=load_settings(), agent_app=agent, key_store=keys.store)


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain; charset=utf-8", None]
)
def test_a_body_read_as_json_naming_another_user_is_refused_whatever_its_type(
    content_type: str | None,
) -> None:
    # curl -d '{"user_id": "bob"}' sends a form's type; request.json() reads it all the same.
    keys = Keys.make()
    headers = bearer(keys.alice)
    if content_type:
        headers["content-type"] = content_type
    with running(_app(keys)) as url:
        for path in ("/notes", "/ep/notes"):
            other = httpx.post(f"{url}{path}", headers=headers, content=b'{"user_id": "bob"}')
            assert other.status_code == 403, (path, other.text)
            own = httpx.post(f"{url}{path}", headers=headers, content=b'{"user_id": "alice"}')
            assert own.json() == {"stored_for": "alice"}, (path, own.text)
            nan = httpx.post(f"{url}{path}", headers=headers, content=b'{"n": [NaN]}')
            assert nan.status_code == 422 and "body.n.0" in nan.text, (path, nan.text)
        # A body that is not JSON (text that happens to name nobody) reaches a route as sent.
        text = httpx.post(f"{url}/raw", headers=headers, content=b"NaN, user_id=bob \xff")
        assert text.json() == {"size": 18}


def test_a_user_named_by_a_number_is_compared_by_its_digits() -> None:
    keys = Keys.make()
    key17, key42 = issue_key(keys.store, "17"), issue_key(keys.store, "42")
    with running(_app(keys)) as url:
        for body in ({"user_id": 42, "item": "x"}, {"user_id": "42", "item": "x"}):
            answer = httpx.post(f"{url}/orders", headers=bearer(key17), json=body)
            assert answer.status_code == 403, (body, answer.text)
        own = httpx.post(f"{url}/orders", headers=bearer(key42), json={"user_id": 42})
        assert own.json() == {"acting_for": 42}
        answer = httpx.post(f"{url}/notes", headers=bearer(key17), json={"user": 41})
        assert answer.status_code == 403, answer.text
        # An @app.endpoint model's user_id, in a list.
        for lines in ([{"user_id": 42}], [{"user_id": "42"}]):
            answer = httpx.post(f"{url}/ep/batch", headers=bearer(key17), json=lines)
            assert answer.status_code == 403, (lines, answer.text)
        answer = httpx.post(f"{url}/ep/batch", headers=bearer(key42), json=[{"user_id": 42}, {}])
        assert answer.json() == {"line_users": [42, 42]}
        # A user_id no user is: 42.0 and true would be read as users 42 and 1.
        for value, kind in ((42.0, "a fraction"), (True, "a boolean"), ({"id": 42}, "an object")):
            for path, sent in (
                ("/orders", {"user_id": value}),
                ("/ep/batch", [{"user_id": value}]),
            ):
                answer = httpx.post(f"{url}{path}", headers=bearer(key42), json=sent)
                assert answer.status_code == 422, (path, value, answer.text)
                assert kind in answer.text
        # A user that is an object is a webhook's payload, naming no user of ours.
        answer = httpx.post(f"{url}/notes", headers=bearer(key17), json={"user": {"id": 42}})
        assert answer.status_code == 200, answer.text


def test_a_form_field_naming_another_user_is_refused() -> None:
    keys = Keys.make()
    alice = bearer(keys.alice)
    multipart = (
        b"--B\r\n"
        b'Content-Disposition: form-data; name="note"\r\n\r\nhi\r\n'
        b"--B\r\n"
        b'Content-Disposition: form-data; name="user_id"\r\n\r\nbob\r\n'
        b"--B--\r\n"
    )
    uploaded = (
        b"--B\r\n"
        b'Content-Disposition: form-data; name="user_id"; filename="bob.txt"\r\n'
        b"Content-Type: text/plain\r\n\r\nbob\r\n"
        b"--B--\r\n"
    )
    with running(_app(keys)) as url:
        for data in ({"user_id": "bob", "text": "t"}, {"user": "bob"}):
            answer = httpx.post(f"{url}/form", headers=alice, data=data)
            assert answer.status_code == 403, (data, answer.text)
        encoded = httpx.post(
            f"{url}/form",
            headers={**alice, "content-type": "application/x-www-form-urlencoded"},
            content=b"text=t&user%5Fid=bob",
        )
        assert encoded.status_code == 403, encoded.text
        own = httpx.post(f"{url}/form", headers=alice, data={"user_id": "alice"})
        assert own.json() == {"stored_for": "alice"}
        in_parts = httpx.post(
            f"{url}/upload",
            headers={**alice, "content-type": "multipart/form-data; boundary=B"},
            content=multipart,
        )
        assert in_parts.status_code == 403, in_parts.text
        # A file is not a field; an empty field is absent (as FastAPI reads it).
        a_file = httpx.post(
            f"{url}/upload",
            headers={**alice, "content-type": 'multipart/form-data; boundary="B"'},
            content=uploaded,
        )
        assert a_file.json() == {"size": len(uploaded)}
        empty = httpx.post(f"{url}/raw", headers=alice, data={"user_id": "", "text": "t"})
        assert empty.status_code == 200, empty.text
        # A service key acts for the one user named.
        service = {**bearer(keys.service), "X-User-Id": "bob"}
        assert httpx.post(f"{url}/form", headers=service, data={"user_id": "bob"}).json() == {
            "stored_for": "bob"
        }
        two = httpx.post(f"{url}/form", headers=service, data={"user_id": "carol"})
        assert two.status_code == 422, two.text


@pytest.fixture(scope="module")
def served() -> Any:
    keys = Keys.make()
    with running(_app(keys)) as url:
        yield url, keys


def _post(served: Any, path: str, content_type: str | None, body: bytes) -> httpx.Response:
    url, keys = served
    headers = bearer(keys.alice)
    if content_type:
        headers["content-type"] = content_type
    return httpx.post(url + path, headers=headers, content=body)


BOB = b'{"user_id": "bob"}'
FORM = "multipart/form-data; boundary=XX"
USER_ID_PART = b'--XX\r\nContent-Disposition: form-data; name="user_id"\r\n\r\nbob\r\n--XX--\r\n'


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", b"note=hi"),
        (FORM, b'--XX\r\nContent-Disposition: form-data; name="note"\r\n\r\nhi\r\n--XX--\r\n'),
    ],
)
def test_an_endpoint_reading_a_form_answers(served: Any, content_type: str, body: bytes) -> None:
    # FastAPI reads the form before the guard runs: the guard checks the form it read.
    answer = _post(served, "/ep/form", content_type, body)
    assert answer.status_code == 200 and answer.json() == {"note": "hi"}, answer.text


def test_an_endpoint_taking_files_answers_and_checks_its_fields(served: Any) -> None:
    url, keys = served
    files = {"upload": ("user_id.txt", b"bob"), "raw": ("r.bin", b"12")}
    answer = httpx.post(
        f"{url}/ep/upload", headers=bearer(keys.alice), files=files, data={"note": "n"}
    )
    assert answer.json() == {"name": "user_id.txt", "size": 5, "note": "n"}, answer.text
    files = {"upload": ("a.txt", b"x")}
    for data in ({"user_id": "bob"}, {"user": "bob"}):
        answer = httpx.post(f"{url}/ep/upload", headers=bearer(keys.alice), files=files, data=data)
        assert answer.status_code == 403, answer.text


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        # Starlette's request.json() ignores the charset and reads UTF-16 and UTF-32 too.
        ("text/plain; charset=latin-1", BOB),
        ("application/x-www-form-urlencoded; charset=iso-8859-1", BOB),
        ("text/plain", BOB.decode().encode("utf-16-le")),
        (None, BOB.decode().encode("utf-16")),
        ("text/plain", BOB.decode().encode("utf-32")),
    ],
)
def test_json_the_route_reads_in_any_encoding_naming_another_user_is_refused(
    served: Any, content_type: str | None, body: bytes
) -> None:
    for path in ("/notes", "/ep/notes"):
        answer = _post(served, path, content_type, body)
        assert answer.status_code == 403, (path, answer.text)


def test_text_the_route_reads_with_surrogate_bytes_is_refused(served: Any) -> None:
    # Starlette's request.json() decodes UTF-8 with surrogatepass: "\ud800" reaches the route.
    answer = _post(served, "/notes", "text/plain", b'{"user_id": "bob", "note": "\xed\xa0\x80"}')
    assert answer.status_code == 422 and "body.note" in answer.text, answer.text


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        (FORM, b"\n" + USER_ID_PART),  # what comes before the first delimiter is skipped
        (FORM, b"\r" + USER_ID_PART),
        (FORM, b"\nignored" + USER_ID_PART),
        ('multipart/form-data; \\\\"; boundary=XX', USER_ID_PART),
        (
            FORM,
            b'--XX\r\nContent-Disposition: form-data; \\\\"; name="user_id"\r\n\r\nbob\r\n'
            b"--XX--\r\n",
        ),
        (
            FORM,
            b'--XX\r\nContent-Disposition: form-data; name="user_id"\r\n--XX: 1\r\n\r\nbob\r\n'
            b"--XX--\r\n",
        ),
    ],
)
def test_a_form_is_read_as_the_route_reads_it(served: Any, content_type: str, body: bytes) -> None:
    for path in ("/form", "/rawform"):
        answer = _post(served, path, content_type, body)
        assert answer.status_code == 403 and "bob" not in answer.text, (path, answer.text)


def test_a_form_the_parser_refuses_is_refused_as_the_route_would(served: Any) -> None:
    many = b"&".join(b"f%d=1" % n for n in range(1001)) + b"&user_id=bob"
    malformed = b"--YY\r\n" + USER_ID_PART
    for path in ("/form", "/raw"):
        answer = _post(served, path, "application/x-www-form-urlencoded", many)
        assert answer.status_code == 400 and "Too many fields" in answer.text, answer.text
        answer = _post(served, path, FORM, malformed)
        assert answer.status_code == 400, answer.text


def test_an_endpoint_reading_a_body_that_is_not_utf8_is_422(served: Any) -> None:
    answer = _post(served, "/ep/notes", "text/plain", b'{"note": "\xff"}')
    assert answer.status_code == 422 and "not valid UTF-8" in answer.text, answer.text


def test_a_service_keys_keyed_request_naming_no_user_runs_once_apart_from_users() -> None:
    keys = Keys.make()
    agent = _agent()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)
    calls: list[str] = []

    @web.post("/reindex")
    async def reindex(request: Request) -> dict[str, Any]:
        calls.append(request.headers["authorization"])
        return {"run": len(calls)}

    app = create_app(settings=load_settings(), agent_app=agent, key_store=keys.store)
    keyed = {"Idempotency-Key": "r-1"}
    with running(app) as url:
        first = httpx.post(f"{url}/reindex", headers={**bearer(keys.service), **keyed}, json={})
        again = httpx.post(f"{url}/reindex", headers={**bearer(keys.service), **keyed}, json={})
        # A user's request with the same key is theirs: it runs, not given the service's.
        users = httpx.post(f"{url}/reindex", headers={**bearer(keys.alice), **keyed}, json={})
        # The runtime's routes still need the user a service key acts for.
        session = httpx.post(f"{url}/sessions", headers={**bearer(keys.service), **keyed})
    assert first.status_code == 200, first.text
    assert again.json() == {"run": 1} and again.headers["idempotent-replayed"] == "true"
    assert users.json() == {"run": 2} and "idempotent-replayed" not in users.headers
    assert session.status_code == 422 and "X-User-Id" in session.text
    assert len(calls) == 2


def _answering_with_headers(response: Response) -> Response:
    response.set_cookie("session", "abc")
    response.set_cookie("theme", "dark")
    response.headers["Content-Disposition"] = 'attachment; filename="r.json"'
    response.headers["ETag"] = '"v1"'
    response.headers["X-Custom"] = "kept"
    return response


def test_a_replay_is_the_first_answer_with_its_headers() -> None:
    keys = Keys.make()
    agent = _agent()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    @web.post("/login")
    async def login(request: Request) -> Response:
        return _answering_with_headers(JSONResponse({"ok": True}, status_code=201))

    @web.post("/big")
    async def big(request: Request) -> Response:
        return Response("ok", headers={"X-Big": "x" * 20_000})

    app = create_app(settings=load_settings(), agent_app=agent, key_store=keys.store)
    headers = {**bearer(keys.alice), "Idempotency-Key": "login-1"}
    with running(app) as url:
        first = httpx.post(f"{url}/login", headers=headers, json={})
        again = httpx.post(f"{url}/login", headers=headers, json={})
        big_headers = {**headers, "Idempotency-Key": "big-1"}
        big_first = httpx.post(f"{url}/big", headers=big_headers, json={})
        big_again = httpx.post(f"{url}/big", headers=big_headers, json={})
    assert again.status_code == first.status_code == 201
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.headers.get_list("set-cookie") == first.headers.get_list("set-cookie")
    assert len(again.headers.get_list("set-cookie")) == 2
    for name in ("content-disposition", "etag", "x-custom", "content-type"):
        assert again.headers.get(name) == first.headers[name], name
    # Each answer has its own date and request id, once.
    for name in ("date", "server", "x-request-id", "content-length"):
        assert len(again.headers.get_list(name)) <= 1, name
    assert again.headers["x-request-id"] != first.headers["x-request-id"]
    # Headers too large to keep make the answer too large to keep: not replayed, not run.
    assert big_first.status_code == 200
    assert big_again.status_code == 409 and "too large" in big_again.text


def test_a_body_a_route_fails_to_parse_as_json_is_422_naming_where() -> None:
    keys = Keys.make()
    agent = _agent()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    @web.post("/echo")
    async def echo(request: Request) -> dict[str, Any]:
        return {"got": await request.json()}

    @web.post("/hooks/in")
    @public
    async def hook(request: Request) -> dict[str, Any]:
        return {"got": await request.json()}

    @web.post("/raw")
    async def raw(request: Request) -> dict[str, Any]:
        return {"size": len(await request.body())}

    @web.post("/upstream")
    async def upstream(request: Request) -> dict[str, Any]:
        return {"got": json.loads("{not the body")}

    @web.post("/upstream-handled")
    async def upstream_handled(request: Request) -> dict[str, Any]:
        return {"got": json.loads("{not the body")}

    @web.exception_handler(ValueError)
    async def value_error(request: Request, exc: ValueError) -> JSONResponse:
        if request.url.path == "/upstream-handled":
            return JSONResponse({"upstream": "unreadable"}, status_code=502)
        raise exc

    app = create_app(settings=load_settings(), agent_app=agent, key_store=keys.store)
    sent_as_json = {"content-type": "application/json"}
    with running(app) as url:
        for path, headers in (("/echo", bearer(keys.alice)), ("/hooks/in", {})):
            for body, where in ((b"{bad", "column 2"), (b'{"a": 1,}', "column 9")):
                answer = httpx.post(
                    f"{url}{path}", headers={**headers, **sent_as_json}, content=body
                )
                assert answer.status_code == 422, (path, body, answer.text)
                assert answer.json()["error"]["code"] == "INVALID_INPUT"
                assert where in answer.text and "not valid JSON" in answer.text
        # A route that never reads the body as JSON is not refused for it.
        raw = httpx.post(
            f"{url}/raw", headers={**bearer(keys.alice), **sent_as_json}, content=b"{bad"
        )
        assert raw.json() == {"size": 4}
        # The route's own failed parse of something else stays its error.
        own = httpx.post(f"{url}/upstream", headers=bearer(keys.alice), json={"a": 1})
        assert own.status_code == 500, own.text
        handled = httpx.post(f"{url}/upstream-handled", headers=bearer(keys.alice), json={})
        assert handled.status_code == 502 and handled.json() == {"upstream": "unreadable"}


def test_a_route_left_open_takes_no_idempotency_key() -> None:
    # No caller to keep the key apart for: anyone could claim the key a sender will use.
    keys = Keys.make()
    agent = _agent()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)
    calls: list[int] = []

    @web.post("/hooks/payments")
    @public
    async def payments(body: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        return {"processed": len(calls)}

    with running(web) as url:
        for _ in range(2):
            answer = httpx.post(
                f"{url}/hooks/payments", headers={"Idempotency-Key": "evt_1"}, json={}
            )
            assert answer.status_code == 200 and "idempotent-replayed" not in answer.headers
    assert calls == [1, 1]


AGENT_MODULE = textwrap.dedent(
    """
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from agentscope_serverless.app import AgentApp

    app = AgentApp(app_name="lambda-guarded")


    @app.query(framework="text")
    async def query(self, msgs, request=None, **kwargs):
        yield "hello"


    web = app.get_fastapi_app()


    @web.post("/notes")
    async def notes(request: Request):
        return {"stored_for": (await request.json()).get("user_id")}


    @web.post("/login")
    async def login(request: Request):
        response = JSONResponse({"ok": True})
        response.set_cookie("session", "abc")
        response.set_cookie("theme", "dark")
        response.headers["Content-Disposition"] = 'attachment; filename="r.json"'
        return response
    """
)


def test_the_process_function_checks_users_routes_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lambda_guarded_agent.py").write_text(AGENT_MODULE)
    keys_file = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys_file), "alice")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("AGENT_APP", "lambda_guarded_agent:app")
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(keys_file))
    handler = make_handler(["process"])
    alice = {"authorization": f"Bearer {key}"}

    def post(path: str, headers: dict[str, str], body: str) -> dict[str, Any]:
        answer: dict[str, Any] = handler(
            function_url_event("POST", path, headers={**alice, **headers}, body=body), None
        )
        return answer

    for content_type in ("application/x-www-form-urlencoded", "text/plain"):
        answer = post("/notes", {"content-type": content_type}, '{"user_id": "bob"}')
        assert answer["statusCode"] == 403, answer
    answer = post("/notes", {"content-type": "application/json"}, '{"user_id": 7}')
    assert answer["statusCode"] == 403, answer
    answer = post("/notes", {"content-type": "application/json"}, '{"a": 1,}')
    assert answer["statusCode"] == 422 and "not valid JSON" in answer["body"], answer
    keyed = {"content-type": "application/json", "idempotency-key": "login-1"}
    first, again = post("/login", keyed, "{}"), post("/login", keyed, "{}")
    assert first["statusCode"] == again["statusCode"] == 200
    assert again["headers"]["idempotent-replayed"] == "true"
    assert sorted(again["cookies"]) == sorted(first["cookies"]) and len(first["cookies"]) == 2
    disposition = first["headers"]["content-disposition"]
    assert again["headers"]["content-disposition"] == disposition
