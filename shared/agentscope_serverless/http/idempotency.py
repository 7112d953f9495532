"""``Idempotency-Key``: a retried write is answered once, and written once.

A write (``POST``, ``PUT``, ``PATCH``, ``DELETE``) sent with an ``Idempotency-Key`` header
claims that key for the caller's user (records live in the store of the session history,
see :mod:`agentscope_serverless.services.idempotency`); a read sent as a ``POST`` (a search,
its query a body: :func:`reads_only`) claims nothing, as a ``GET`` does, and reads anew:

- the first request with the key runs; a 2xx answer is kept (status, body and headers,
  each of several ``Set-Cookie`` too, but those of the connection or of that response
  alone: ``Date``, ``Server``, ``Content-Length``, ``X-Request-Id``, CORS's... see
  :data:`_DROPPED_HEADERS`) for ``IDEMPOTENCY_EXPIRY_SECONDS``;
- a request repeating the key, method, path, query and body (a JSON body the same JSON,
  whatever the order of its members and its spacing: :func:`canonical_json`) gets that
  answer again, with ``Idempotent-Replayed: true``, and writes nothing;
- the same key with another request is 409 ``IDEMPOTENCY_KEY_REUSED``;
- deleting a session forgets the keys of the requests that wrote in it (a run, messages
  appended, the session created, its state saved), and erasing a user's data all of
  theirs: a kept answer quotes what was deleted, and a retry then runs anew; so does a
  retry whose session is gone otherwise (it expired: ``SESSION_TTL_SECONDS``), its kept
  answer forgotten then; a state save's whose session's state is gone (deleted alone, or
  expired: :func:`kept_while`);
- message ids, new session ids and the ids of its other writes (a state save without a
  round, a memory add) derive from the key and the request, and stores keep the write ids
  they applied with the data, so a run of the same request after one whose answer was lost
  (its store froze or failed mid-write, and the write landed later) stores nothing twice
  (:mod:`agentscope_serverless.services._once`), while another request reusing a freed key
  stores its own; write ids derive from the key's record too, so a request whose record was
  erased or expired runs anew: its state save takes the next round, its memories are added;
- while the first request runs, the key answers 409 ``REQUEST_IN_PROGRESS`` with
  ``Retry-After``, however long it runs (it renews its lease as it goes); a request that
  failed (any answer other than 2xx) frees the key, and a request whose process died or
  whose store call hung frees it after ``IDEMPOTENCY_LEASE_SECONDS``.

A streamed answer (``/process`` with ``stream: true``) is kept whole and replayed at once. A
client that leaves before the answer ends does not end the request (a run goes on without
it): the answer is made and kept all the same, so its retry gets it rather than running the
request again; a run that cancels on disconnect frees the key instead. A streamed answer is
a 200 however its run ends: one whose run failed as the answer not streamed would have
failed with a 429 or a 5xx (the sandbox server at capacity, its store did not answer) frees
the key as that answer would (:func:`fails_when`), so the retry it asks for runs again.

A JSON-RPC call (A2A's) is answered with a 200 whether it failed or not: an answer that is
a JSON-RPC error (a stream whose first event is one) frees the key too. The call's ``id``
is not part of what makes two calls the same (:func:`fingerprint_body`): a client gives each
call a new one, its retries too; a replayed answer carries the retry's.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentscope_serverless.errors import (
    AgentScopeServerlessError,
    IdempotencyKeyReusedError,
    InvalidInputError,
    RequestInProgressError,
    StoreUnavailableError,
)
from agentscope_serverless.http.errors import response_for
from agentscope_serverless.http.params import SESSION_HEADER
from agentscope_serverless.log import logger
from agentscope_serverless.schemas.agent_schemas import (
    RunStatus,
    first_response_id,
    seed_message_ids,
)
from agentscope_serverless.services._once import seed_writes
from agentscope_serverless.services._turn import repeats_earlier_request
from agentscope_serverless.services.idempotency import (
    Claim,
    ClaimOutcome,
    IdempotencyStore,
    StoredResponse,
)
from agentscope_serverless.services.idempotency.base import MAX_STORED_RESPONSE_BYTES
from agentscope_serverless.services.runs.base import RUN_LOST, RunRecord, RunsService
from agentscope_serverless.services.session_history.base import SessionHistoryService

IDEMPOTENCY_HEADER = "Idempotency-Key"
WRITE_METHODS = frozenset(("POST", "PUT", "PATCH", "DELETE"))
REPLAYED_HEADER = "Idempotent-Replayed"
# Visible ASCII: a key is an opaque token (a uuid, say) the client makes.
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]+$"
# Headers of an answer not kept for its replay: those of the connection, and those each
# response has its own (its date, its request's id, what its CORS layer allowed its origin).
_DROPPED_HEADERS = frozenset(
    (
        "connection",
        "content-length",
        "date",
        "keep-alive",
        "proxy-connection",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "x-request-id",
        REPLAYED_HEADER.lower(),
    )
)
_DROPPED_PREFIXES = ("access-control-",)
# The most bytes the headers kept with an answer take stored (as JSON; counted in the bytes
# it may take): an answer whose headers take more is too large to keep.
MAX_KEPT_HEADER_BYTES = 16_384
# Kept under one name, the values of a header sent several times (Set-Cookie) are joined by
# a line break, which no header's value holds.
_VALUES_SEPARATOR = "\n"
_KEY_HEADER = IDEMPOTENCY_HEADER.lower().encode()
_STATE = "idempotency_claim"
_ENDS_WITH_CLIENT = "idempotency_ends_with_client"
_SESSION = "idempotency_session"
_FAILED = "idempotency_failed"
_FINGERPRINTED = "idempotency_fingerprinted"
_FINGERPRINT = "idempotency_fingerprint"
_SETTLE_SECONDS = 3.0
# A request renews its key's lease this many times a lease, so a renewal that fails (a
# store slow for a moment) leaves others to come before the lease runs out.
_RENEWALS_PER_LEASE = 3


EndpointT = TypeVar("EndpointT", bound=Callable[..., Any])
# The endpoints of the routes that take a POST only to read (see reads_only).
_READ_ENDPOINTS: set[Callable[..., Any]] = set()
# Whether what a route's request wrote in its session remains, by endpoint (see
# kept_while); a route not listed wrote in the session's history.
SessionCheck = Callable[[Request, str, str], Awaitable[bool]]
_SESSION_CHECKS: dict[Callable[..., Any], SessionCheck] = {}


def reads_only(endpoint: EndpointT) -> EndpointT:
    """Declare the endpoint of a ``POST`` route that only reads (a search, its query a body):
    its ``Idempotency-Key`` claims nothing, as a ``GET``'s, so a later request with the same
    key reads anew, not what was read for the first.

    >>> @reads_only
    ... async def search() -> None: ...
    """
    _READ_ENDPOINTS.add(endpoint)
    return endpoint


def kept_while(check: SessionCheck) -> Callable[[EndpointT], EndpointT]:
    """Declare what the requests of a route write in their session (:func:`writes_in_session`)
    when it is not the session's history: ``await check(request, user_id, session_id)``
    says whether it remains, and a kept answer is replayed only while it does (a state save's
    rounds may outlive the session's history, or be deleted without it).

    >>> async def has_state(request: Request, user_id: str, session_id: str) -> bool:
    ...     return True
    >>> @kept_while(has_state)
    ... async def save() -> None: ...
    """

    def declare(endpoint: EndpointT) -> EndpointT:
        _SESSION_CHECKS[endpoint] = check
        return endpoint

    return declare


def only_reads(endpoint: Any) -> bool:
    """Whether ``endpoint`` was declared :func:`reads_only`."""
    return endpoint in _READ_ENDPOINTS


def is_write(request: Request) -> bool:
    """Whether ``request`` may write, and so claims its ``Idempotency-Key``: a method of
    :data:`WRITE_METHODS`, to a route whose endpoint is not :func:`reads_only`."""
    endpoint = getattr(request.scope.get("route"), "endpoint", None)
    return request.method in WRITE_METHODS and not only_reads(endpoint)


class Replay(Exception):
    """The request's key was answered before: send the stored answer."""

    def __init__(self, response: StoredResponse) -> None:
        super().__init__("replay")
        self.response = response


def fingerprint(request: Request, body: bytes) -> str:
    """What makes two requests "the same": method, path, query, ``X-Session-Id`` (which names
    the session of an OpenAI-compatible call) and body (or what :func:`fingerprint_body`
    gave in its place). A request with an ``Idempotency-Key`` whose body is JSON is the same
    as another whose body is the same JSON, whatever the order of its members and its
    spacing (:func:`canonical_json`). Made once per request (a keyed OpenAI-compatible call
    asks twice: for its key, and for an SDK's retry)."""
    state = request.scope.setdefault("state", {})
    made: str | None = state.get(_FINGERPRINT)
    if made is not None:
        return made
    digest = hashlib.sha256()
    session = ",".join(request.headers.getlist(SESSION_HEADER))
    for part in (request.method, request.url.path, request.url.query, session):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    given = state.get(_FINGERPRINTED)
    if given is None:
        # Only a keyed request pays for the parse: others are compared as sent (an SDK's
        # retry resends the same bytes).
        keyed = IDEMPOTENCY_HEADER in request.headers
        given = canonical_json(body) if keyed else body
    digest.update(given)
    made = state[_FINGERPRINT] = digest.hexdigest()
    return made


def canonical_json(body: bytes) -> bytes:
    r"""``body`` in one form for every way of writing the same JSON (members sorted, no
    spaces, characters as UTF-8); a body that is not JSON as it is.

    >>> canonical_json(b'{"b": [1, 2], "a": "\\u00e9"}')
    b'{"a":"\xc3\xa9","b":[1,2]}'
    >>> canonical_json(b"not json")
    b'not json'
    """
    try:
        parsed = json.loads(body)
        return json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )
    except (ValueError, RecursionError):  # not JSON (or not UTF-8), too deep, too long
        return body


def fingerprint_body(request: Request, body: bytes) -> None:
    """The request is the same as another when ``body`` is, whatever its own body: a
    JSON-RPC call's without its ``id``, which differs between a call and its retry."""
    state = request.scope.setdefault("state", {})
    state[_FINGERPRINTED] = body
    state.pop(_FINGERPRINT, None)


async def claim_key(request: Request, user_id: str, key: str) -> None:
    """Claim ``key`` for this request, or answer it (replay, 409) without running it."""
    if request.headers.getlist(IDEMPOTENCY_HEADER)[1:]:
        raise InvalidInputError(
            f"the {IDEMPOTENCY_HEADER} header is given more than once", field=IDEMPOTENCY_HEADER
        )
    store: IdempotencyStore | None = request.app.state.context.idempotency
    if store is None:
        return
    made = fingerprint(request, await request.body())
    claim = await store.begin(user_id, key, made)
    if claim.outcome is ClaimOutcome.REPLAY and not await _session_remains(request, claim):
        # Its answer would say what it wrote is stored: the request runs as a first would
        # (unless a retry beside it claimed the key first, whose answer is then the one).
        await store.forget(claim)
        claim = await store.begin(user_id, key, made)
    if claim.outcome is ClaimOutcome.CLAIMED:
        holding = asyncio.create_task(_hold(store, claim))
        request.scope.setdefault("state", {})[_STATE] = (store, claim, holding)
        _seed_ids(claim, f"{user_id}\0{key}\0{claim.fingerprint}")
    elif claim.outcome is ClaimOutcome.REPLAY:
        assert claim.response is not None
        raise Replay(claim.response)
    elif claim.outcome is ClaimOutcome.MISMATCH:
        raise IdempotencyKeyReusedError(
            f"this {IDEMPOTENCY_HEADER} was used for another request: use a new key"
        )
    else:
        raise RequestInProgressError(
            f"a request with this {IDEMPOTENCY_HEADER} is still running: retry later"
        )


async def _session_remains(request: Request, claim: Claim) -> bool:
    """Whether the session the request of ``claim`` wrote in (if any) still exists: one
    that expired (``SESSION_TTL_SECONDS``) took what the request wrote with it. What a
    route declared :func:`kept_while` wrote is asked for instead (a retry has its request's
    method and path, so its route)."""
    if claim.session_id is None:
        return True
    endpoint = getattr(request.scope.get("route"), "endpoint", None)
    check = _SESSION_CHECKS.get(endpoint) if endpoint is not None else None
    if check is not None:
        return await check(request, claim.user_id, claim.session_id)
    history: SessionHistoryService = request.app.state.context.session_history
    return await history.has_session(claim.user_id, claim.session_id)


class IdempotencyMiddleware:
    """Keeps the answer of a request that claimed its key, or frees the key when it failed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") not in WRITE_METHODS
            or not any(name.lower() == _KEY_HEADER for name, _ in scope["headers"])
        ):
            # Nothing to keep: only a request with a key claims one.
            await self.app(scope, receive, send)
            return
        status = 0
        headers: dict[str, str] = {}
        chunks: list[bytes] = []
        size = 0

        async def keep(message: Message) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = message["status"]
                headers.update(_kept_headers(message.get("headers", ())))
                # As stored (JSON), headers too large make the answer too large to keep.
                kept = len(json.dumps(headers))
                size += kept if kept <= MAX_KEPT_HEADER_BYTES else MAX_STORED_RESPONSE_BYTES + 1
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if size <= MAX_STORED_RESPONSE_BYTES:
                    chunks.append(body)
                size += len(body)
                if not message.get("more_body", False):
                    # Settled before the client sees the end: its next request finds the
                    # answer kept (or the key free), never this request still running.
                    answer = StoredResponse(status, headers, b"".join(chunks))
                    failed = scope.get("state", {}).get(_FAILED)
                    kept = 200 <= status < 300 and not (failed is not None and failed())
                    await _finish(scope, answer if kept else None, size)
            await send(message)

        async def receive_past_leaving() -> Message:
            message = await receive()
            state = scope.get("state", {})
            leaving = message["type"] == "http.disconnect"
            if leaving and _STATE in state and not state.get(_ENDS_WITH_CLIENT):
                # Its client left, but the request goes on (a run does): it is answered as
                # if the client were there, and the answer kept for the retry, which would
                # otherwise run it again.
                await asyncio.Future()  # cancelled when the response ends
            return message

        try:
            await self.app(scope, receive_past_leaving, keep)
        finally:
            await _finish(scope, None, size)


async def seed_run(request: Request, runs: RunsService | None) -> None:
    """Seed the ids of the run a keyed request starts now (its id, its reply's messages,
    its memories): those of the request's earlier attempts, so a run again after one whose
    answer was lost stores nothing twice; but new ones after an attempt whose run ended
    short of its turn (canceled, or failed), which freed the key for the request to run
    anew: under that run's id its events would mix with the new run's, and under the ids
    of a part of its reply kept (a run canceled midway) the whole reply would be skipped as
    stored already. The input keeps the ids the request gave it: it is stored once.

    An earlier attempt's run whose id the run takes again (one lost, one failed when its
    store did not answer, one whose answer was not kept) is discarded first: what is read
    back under the id (its events, its place among the session's runs) is then the new run
    alone, not the earlier one's mixed with it."""
    claimed = request.scope.get("state", {}).get(_STATE)
    if claimed is None or runs is None:
        return
    claim: Claim = claimed[1]
    for attempt in itertools.count():
        seed = f"{claim.user_id}\0{claim.key}\0{claim.fingerprint}\0run {attempt}"
        earlier = await runs.get_run(claim.user_id, first_response_id(seed))
        if earlier is None or not _ended_short(earlier):
            break
    if earlier is not None:
        # Its request holds the key no longer: its process stopped, or it failed.
        await runs.discard_run(claim.user_id, earlier.id)
    if earlier is not None or attempt > 0:
        repeats_earlier_request()  # whose run may have stored the input
    _seed_ids(claim, seed)


def _seed_ids(claim: Claim, seed: str) -> None:
    """Derive the ids the request of ``claim`` makes from now on from ``seed`` (its user,
    key and fingerprint): a run of it after an earlier one that wrote but never answered
    (its store froze) makes the same message ids and new session ids, so its appends store
    nothing twice; its other writes (state rounds, memories) are keyed the same way while
    its key's record lives. Their write ids derive from the record's seed too: after the
    record expired or was erased, they are new writes. The key reused for another request
    (once freed by a request that failed, or expired) writes anew."""
    seed_message_ids(seed)
    seed_writes(seed, claim.seed)


def _ended_short(run: RunRecord) -> bool:
    """Whether ``run`` ended without its whole turn, storing only what it meant to (its
    input, a reply cut short). Not a run that may have stored its turn unseen: one that
    failed when its store did not answer (the write may have landed), or one lost."""
    if run.status == RunStatus.Canceled:
        return True
    code = (run.error or {}).get("code")
    return run.status == RunStatus.Failed and code not in (StoreUnavailableError.code, RUN_LOST)


def writes_in_session(request: Request, session_id: str) -> None:
    """The request writes in ``session_id``: its kept answer goes when the session does."""
    request.scope.setdefault("state", {})[_SESSION] = session_id


def ends_with_client(request: Request) -> None:
    """The request stops when its client leaves (a run that cancels on disconnect): its
    key is then freed, as for any request that did not answer."""
    request.scope.setdefault("state", {})[_ENDS_WITH_CLIENT] = True


def fails_when(request: Request, failed: Callable[[], bool]) -> None:
    """The request's answer is a 200 that may be a failure (a stream, sent before it is
    known how it ends; a JSON-RPC error): ``failed()``, asked as it ends, says whether it
    is one worth a retry, when the key is freed instead of keeping the answer.

    Held only by a request that claimed its key, until its answer ends: ``failed`` may hold
    what made the answer (a run, its whole reply), and the request's scope outlives it (a
    keep-alive connection keeps its last request's)."""
    state = request.scope.setdefault("state", {})
    if _STATE in state:
        state[_FAILED] = failed


async def _hold(store: IdempotencyStore, claim: Claim) -> None:
    """Renew the claim's lease while its request runs (until cancelled, when it ends): a
    run may last longer than a lease, and a retry taking the key over would run it again.
    A renewal that fails is logged; the next one may land."""
    while True:
        await asyncio.sleep(store.lease_seconds / _RENEWALS_PER_LEASE)
        try:
            async with asyncio.timeout(store.lease_seconds):
                await store.renew(claim)
        except (AgentScopeServerlessError, TimeoutError) as exc:
            logger.warning("idempotency lease not renewed", extra={"error": type(exc).__name__})


async def _finish(scope: Scope, answer: StoredResponse | None, size: int) -> None:
    """Keep ``answer`` for the request's key, or free the key (once per request)."""
    scope.get("state", {}).pop(_FAILED, None)
    claimed = scope.get("state", {}).pop(_STATE, None)
    if claimed is None:
        return
    store, claim, holding = claimed
    session_id = scope["state"].get(_SESSION)
    holding.cancel()
    try:
        # Bounded: a store that stopped answering must not hold the answer back for long.
        async with asyncio.timeout(_SETTLE_SECONDS):
            if answer is None:
                await store.abandon(claim)
            elif size > MAX_STORED_RESPONSE_BYTES:
                await store.complete(claim, _too_large(answer.status), session_id)
            else:
                await store.complete(claim, answer, session_id)
    except (AgentScopeServerlessError, TimeoutError) as exc:
        # The key stays claimed until its lease ends; a retry then runs the request.
        logger.warning("idempotency record not updated", extra={"error": type(exc).__name__})


def _kept_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The headers of an answer kept for its replay (names in lower case), the values of
    one sent several times joined (see :data:`_VALUES_SEPARATOR`)."""
    kept: dict[str, str] = {}
    for name, value in raw:
        lowered = bytes(name).decode("latin-1").lower()
        if lowered in _DROPPED_HEADERS or lowered.startswith(_DROPPED_PREFIXES):
            continue
        text = bytes(value).decode("latin-1")
        kept[lowered] = f"{kept[lowered]}{_VALUES_SEPARATOR}{text}" if lowered in kept else text
    return kept


def _too_large(status: int) -> StoredResponse:
    error = IdempotencyKeyReusedError(
        f"this {IDEMPOTENCY_HEADER} was answered with {status}, but the answer was too large "
        "to keep: it is not repeated"
    )
    response = response_for(error)
    headers = {"content-type": "application/json", "x-should-retry": "false"}
    return StoredResponse(409, headers, bytes(response.body))


def replayed(stored: StoredResponse, body: bytes | None = None) -> Response:
    """The kept answer ``stored`` sent again, with ``body`` in place of its own if given (a
    JSON-RPC answer carrying the retry's id)."""
    response = Response(
        stored.body if body is None else body,
        status_code=stored.status,
        media_type=stored.headers.get("content-type"),
    )
    for name, values in stored.headers.items():
        if name in ("content-type", "content-length"):
            continue
        for value in values.split(_VALUES_SEPARATOR):
            response.raw_headers.append((name.encode("latin-1"), value.encode("latin-1")))
    response.headers[REPLAYED_HEADER] = "true"
    return response


async def _replay(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Replay)
    return replayed(exc.response)


async def _in_progress(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestInProgressError)
    return in_progress_response(request, exc)


def in_progress_response(request: Request, exc: RequestInProgressError) -> Response:
    """The answer to a request whose key another request holds: a 409 whose ``Retry-After``
    is the key's lease (1 to 60 seconds)."""
    response = response_for(exc)
    store: IdempotencyStore | None = request.app.state.context.idempotency
    lease = store.lease_seconds if store is not None else 1
    response.headers["Retry-After"] = str(max(1, min(int(lease), 60)))
    return response


def install_idempotency(app: FastAPI) -> None:
    """Keep answers of claimed keys, and answer replays and in-progress keys."""
    app.add_middleware(IdempotencyMiddleware)
    app.add_exception_handler(Replay, _replay)
    app.add_exception_handler(RequestInProgressError, _in_progress)


__all__ = [
    "IDEMPOTENCY_HEADER",
    "IDEMPOTENCY_KEY_PATTERN",
    "MAX_KEPT_HEADER_BYTES",
    "REPLAYED_HEADER",
    "WRITE_METHODS",
    "IdempotencyMiddleware",
    "Replay",
    "canonical_json",
    "claim_key",
    "ends_with_client",
    "fails_when",
    "fingerprint",
    "fingerprint_body",
    "in_progress_response",
    "install_idempotency",
    "is_write",
    "kept_while",
    "reads_only",
    "replayed",
    "seed_run",
    "writes_in_session",
]
