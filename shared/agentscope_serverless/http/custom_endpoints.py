"""The routes an :class:`AgentApp` adds with ``@app.endpoint(path, methods)``, behind auth.

A handler's body model with a ``user_id`` field (an ``AgentRequest``, as AgentScope's
handlers take) gets there the user the request acts as, however the parameter is declared
(``Annotated[Model, Body(embed=True)]``, ``Model | None``, ``list[Model]``, a model nested in
another): before FastAPI validates the body, each such ``user_id`` is checked as a body's
``user_id`` is on every route (naming another user than the caller acts as: 403 for a user
key, 422 for a service key naming another user elsewhere; a number names the user of its
digits, and a value that is neither a string nor an integer is 422) and, when absent or
null, set to that user, so a required ``user_id`` need not be sent. The request's body is
checked as a route a user adds has it checked (a body of any type that parses as JSON, a
form's ``user_id`` fields: see :mod:`.guards`). A ``user_id`` path parameter
(``/users/{user_id}/...``) names a user as the ``X-User-Id`` header does. What the handler
does runs for that user too, as a run does for its: an A2A agent tool it calls, or a sandbox
it connects naming no user, acts for them.

A handler is a FastAPI endpoint; one reading the request's body itself (``await
request.json()``) that is sent a body that is not JSON answers 422, saying where it does not
parse, as one taking a body model does (one that is not UTF-8 text: 422 saying so). A
generator (sync or async) is streamed as Server-Sent Events, one ``data: <JSON>`` line per
item, as AgentScope Runtime streams them: text items are sent as JSON strings (in UTF-8),
pydantic models, dataclasses and objects with ``to_dict()`` (or ``to_map()``) as their JSON
objects, at any depth, tuples and sets as arrays, anything else as its ``str()``; ``bytes``
go out as they are, no ``data:`` added (a generator's own events, ``b"data: 1\\n\\n"``).
A sync generator (a plain function too) runs in a worker thread, so a blocking one holds up
no other request; a daemon thread, so one that never returns does not keep the server from
exiting once stopped. A generator that raises (whatever: a ``KeyboardInterrupt`` too, which the
server outlives) ends the stream with AgentScope's error item,
``{"error": "<the exception's message>", "error_type": "<its class>", "message": "Error in
streaming generator"}``, the settings' secrets (and the agent's own) replaced by ``***``; so
does an item holding a number JSON cannot carry (NaN, Infinity). A generator whose client
leaves is closed: its ``finally`` runs then, a sync one's in its thread (once the step it
may be taking is over), an async one's to its end, awaits included, as a canceled run's
agent's does (cut short if still going 3 s later; a sync one's is left to its thread then,
which cannot be stopped, and the response ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import types
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Mapping,
)
from typing import Annotated, Any, Union, get_args, get_origin

import anyio
from fastapi import APIRouter, Depends, Request, Response, params
from fastapi.dependencies.models import Dependant
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, RootModel
from pydantic.fields import FieldInfo
from starlette.types import Receive, Scope, Send

from agentscope_serverless.cancellation import CLEANUP_SECONDS, cancelled_from_outside
from agentscope_serverless.http.auth import (
    USER_PARAMETER,
    Caller,
    KeyedRoute,
    bearer_scheme,
    claiming_path_user,
    current_user_id,
    get_caller,
)
from agentscope_serverless.http.bodies import utf8_request
from agentscope_serverless.http.errors import unreadable_body
from agentscope_serverless.http.guards import (
    body_as_read,
    is_parse_of,
    named_users,
    not_json,
    read_as_users_route,
)
from agentscope_serverless.http.sse import escape_line_breaks
from agentscope_serverless.log import logger, redacted
from agentscope_serverless.services._turn import acting_for
from agentscope_serverless.threads import ThreadWorker, run_in_thread

# Deeper than this, a value is sent as its str(): a structure that contains itself ends.
_MAX_DEPTH = 100
# The parameter of a handler's endpoint that receives the user the request acts as.
_CALLER_PARAMETER = "agentscope_caller_user_id"


def _jsonable(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON values."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if depth >= _MAX_DEPTH:
        return str(value)
    if isinstance(value, dict):
        return {str(key): _jsonable(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(item, depth + 1) for item in value]
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return {f.name: _jsonable(getattr(value, f.name), depth + 1) for f in fields}
    for name in ("to_map", "to_dict"):
        method = getattr(value, name, None)
        if callable(method):
            return _jsonable(method(), depth + 1)
    return str(value)


def _streamed(item: Any) -> str | bytes:
    """What a generator's ``item`` sends: its ``data:`` line; bytes as they are (the
    generator's own, say whole SSE events), not their repr."""
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item)
    return _encode(item)


def _encode(item: Any) -> str:
    if isinstance(item, BaseModel):
        body = item.model_dump_json()
    else:
        try:
            body = json.dumps(_jsonable(item), ensure_ascii=False, allow_nan=False)
        except ValueError:
            raise ValueError(
                "the item holds a number JSON cannot carry (NaN or Infinity)"
            ) from None
    return f"data: {escape_line_breaks(body)}\n\n"


def _error_item(exc: BaseException) -> str:
    """AgentScope's last item of a stream whose generator raised ``exc``."""
    message = redacted(str(exc))
    logger.exception("a streamed endpoint failed", extra={"error": type(exc).__name__})
    error = {
        "error": message,
        "error_type": type(exc).__name__,
        "message": "Error in streaming generator",
    }
    return _encode(error)


# The field of a body model naming the user the request acts as.
_USER_FIELD = "user_id"


# Called on a body's object that is a model with a ``user_id`` field, with the keys it may
# be sent under.
_UserOf = Callable[[dict[str, Any], tuple[str, ...]], None]


class _Users:
    """Where the ``user_id`` fields of a JSON value of some type are (see :func:`_users`)."""

    def visit(self, value: Any, user_of: _UserOf) -> None:
        """Call ``user_of`` on each object of ``value`` that is a model with a ``user_id``."""
        raise NotImplementedError


@dataclasses.dataclass(eq=False)
class _Model(_Users):
    """An object of a model: its ``user_id`` keys (none without the field), and its fields
    holding such models."""

    keys: tuple[str, ...]
    fields: list[tuple[tuple[str, ...], _Users]] = dataclasses.field(default_factory=list)

    def visit(self, value: Any, user_of: _UserOf) -> None:
        if not isinstance(value, dict):
            return
        if self.keys:
            user_of(value, self.keys)
        for keys, users in self.fields:
            for key in keys:
                if key in value:
                    users.visit(value[key], user_of)


@dataclasses.dataclass(eq=False)
class _Items(_Users):
    """The items of an array (or the values of an object, ``mapping``)."""

    items: _Users
    mapping: bool = False

    def visit(self, value: Any, user_of: _UserOf) -> None:
        if self.mapping and isinstance(value, dict):
            values: Iterable[Any] = value.values()
        elif not self.mapping and isinstance(value, list):
            values = value
        else:
            return
        for item in values:
            self.items.visit(item, user_of)


@dataclasses.dataclass(eq=False)
class _Either(_Users):
    """A value of one of several types (a union)."""

    choices: list[_Users]

    def visit(self, value: Any, user_of: _UserOf) -> None:
        for choice in self.choices:
            choice.visit(value, user_of)


def _keys(name: str, field: FieldInfo) -> tuple[str, ...]:
    """The keys a model's field may be sent under: its name and its aliases."""
    aliases = (field.alias, field.validation_alias)
    return tuple(dict.fromkeys(key for key in (*aliases, name) if isinstance(key, str)))


def _users(annotation: Any, models: dict[type[BaseModel], _Model]) -> _Users | None:
    """Where a value of the type ``annotation`` holds a model with a ``user_id`` field,
    through ``Annotated``, unions, sequences, mappings, root models and other models' fields;
    None when nowhere. ``models`` are those seen (a model may hold itself)."""
    origin = get_origin(annotation)
    arguments = get_args(annotation)
    if origin is Annotated:
        return _users(arguments[0], models)
    if origin is Union or origin is types.UnionType:
        choices = [users for choice in arguments if (users := _users(choice, models)) is not None]
        return _Either(choices) if len(choices) > 1 else (choices[0] if choices else None)
    if isinstance(origin, type) and issubclass(origin, Mapping):
        items = _users(arguments[-1], models) if arguments else None
        return _Items(items, mapping=True) if items is not None else None
    if isinstance(origin, type) and issubclass(origin, Iterable) and arguments:
        choices = [
            users
            for item in arguments
            if item is not ... and (users := _users(item, models)) is not None
        ]
        if not choices:
            return None
        return _Items(choices[0] if len(choices) == 1 else _Either(choices))
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return None
    fields = annotation.model_fields
    if issubclass(annotation, RootModel):
        # Sent as its root value, not as an object holding it.
        return _users(fields["root"].annotation, models)
    if annotation in models:
        return models[annotation]
    user = fields.get(_USER_FIELD)
    model = models[annotation] = _Model(_keys(_USER_FIELD, user) if user else ())
    for name, field in fields.items():
        users = _users(field.annotation, models)
        if users is not None:
            model.fields.append((_keys(name, field), users))
    return model if model.keys or model.fields else None


def _body_params(dependant: Dependant) -> list[Any]:
    """The body parameters of an endpoint and its dependencies."""
    found = list(dependant.body_params)
    for dependency in dependant.dependencies:
        found.extend(_body_params(dependency))
    return found


class _EndpointRoute(KeyedRoute):
    """A custom endpoint's route: before FastAPI reads the request, a ``user_id`` path
    parameter is one of the users the request names, and the ``user_id`` fields of the body's
    models are checked and filled (see the module)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        declared = super().get_route_handler()
        names_user = USER_PARAMETER in self.param_convertors
        bodies = self._user_bodies()

        async def handle(request: Request) -> Response:
            request = utf8_request(request)
            read_as_users_route(request)
            caller = await get_caller(request, await bearer_scheme(request))
            if names_user:
                caller = claiming_path_user(request, caller)
            if bodies:
                await _fill_users(request, caller, bodies)
            return await declared(request)

        return handle

    def _user_bodies(self) -> list[tuple[str | None, _Users]]:
        """Where the body's models with a ``user_id`` are: each body parameter's key in the
        body (None for the whole body, a single parameter not embedded, as FastAPI reads
        it), with what its value holds."""
        body_params = _body_params(self.dependant)
        if not body_params or any(isinstance(p.field_info, params.Form) for p in body_params):
            return []
        embedded = len({p.name for p in body_params}) > 1 or bool(
            getattr(body_params[0].field_info, "embed", False)
        )
        models: dict[type[BaseModel], _Model] = {}
        found = []
        for param in body_params:
            users = _users(param.field_info.annotation, models)
            if users is not None:
                found.append((param.alias if embedded else None, users))
        return found


async def _fill_users(
    request: Request, caller: Caller, bodies: list[tuple[str | None, _Users]]
) -> None:
    """Check each ``user_id`` of the JSON body's models against what ``caller`` may act as
    (403 or 422 as for a body's ``user_id``), and set those absent, null or empty to the user it
    acts as, in the body FastAPI then reads. A body of any type is checked when it parses
    as JSON (a handler may read it with ``await request.json()``); one that does not is
    left to FastAPI."""
    body = await body_as_read(request)
    if body is None:
        return

    def user_of(model: dict[str, Any], keys: tuple[str, ...]) -> None:
        named = False
        for key in keys:
            claimed = model.get(key)
            if claimed is not None and claimed != "":
                caller.user_id(body=named_users({_USER_FIELD: claimed}))
                named = True
        if not named:
            model[keys[0]] = caller.user_id()

    for key, users in bodies:
        if key is None:
            users.visit(body, user_of)
        elif isinstance(body, dict) and key in body:
            users.visit(body[key], user_of)


def _acting_as_caller(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` run for the caller's user, its body models with a ``user_id`` field given
    that user (a generator of the same kind; a plain function's call in a daemon thread, see
    :mod:`~agentscope_serverless.threads`, so one that never returns does not keep the
    server from exiting)."""
    signature = inspect.signature(handler, eval_str=True)
    bodies = [
        name
        for name, parameter in signature.parameters.items()
        if isinstance(parameter.annotation, type)
        and issubclass(parameter.annotation, BaseModel)
        and "user_id" in parameter.annotation.model_fields
    ]

    def filled(user_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        for name in bodies:
            if isinstance(kwargs.get(name), BaseModel):
                kwargs[name] = kwargs[name].model_copy(update={"user_id": user_id})
        return kwargs

    endpoint: Callable[..., Any]
    if inspect.isasyncgenfunction(handler):

        async def endpoint(**kwargs: Any) -> Any:
            user_id = kwargs.pop(_CALLER_PARAMETER)
            with acting_for(user_id):
                async for item in handler(**filled(user_id, kwargs)):
                    yield item

    elif inspect.isgeneratorfunction(handler):

        def endpoint(**kwargs: Any) -> Any:
            user_id = kwargs.pop(_CALLER_PARAMETER)
            items = handler(**filled(user_id, kwargs))
            try:
                while True:
                    # Each step runs in a copy of the context (in the stream's thread).
                    with acting_for(user_id):
                        try:
                            item = next(items)
                        except StopIteration:
                            return
                    yield item
            finally:
                # Closed early (its client left): the handler's ``finally`` runs now.
                with acting_for(user_id):
                    items.close()

    elif inspect.iscoroutinefunction(handler):
        requests = _request_parameters(signature)

        async def endpoint(**kwargs: Any) -> Any:
            user_id = kwargs.pop(_CALLER_PARAMETER)
            with acting_for(user_id), _failing_as_an_exception():
                try:
                    return await handler(**filled(user_id, kwargs))
                except json.JSONDecodeError as exc:
                    if await _parsed_the_body(exc, [kwargs[name] for name in requests]):
                        raise not_json(exc) from exc
                    raise
                except UnicodeDecodeError as exc:
                    # The body read as JSON (``await request.json()``) is not UTF-8 text.
                    if await _decoded_the_body(exc, [kwargs[name] for name in requests]):
                        raise unreadable_body(exc) or exc from exc
                    raise

    else:

        async def endpoint(**kwargs: Any) -> Any:
            user_id = kwargs.pop(_CALLER_PARAMETER)

            def call() -> Any:
                with acting_for(user_id):
                    return handler(**filled(user_id, kwargs))

            with _failing_as_an_exception():
                return await run_in_thread(call)

    caller = inspect.Parameter(
        _CALLER_PARAMETER,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[str, Depends(current_user_id)],
    )
    # Before a ``**kwargs`` parameter, which must come last.
    parameters = sorted(
        [*signature.parameters.values(), caller],
        key=lambda parameter: parameter.kind == inspect.Parameter.VAR_KEYWORD,
    )
    endpoint.__signature__ = signature.replace(parameters=parameters)  # type: ignore[union-attr]
    endpoint.__name__ = getattr(handler, "__name__", "endpoint")
    endpoint.__doc__ = handler.__doc__
    return endpoint


class _RaisedByEndpoint(Exception):
    """An exception of an endpoint's that is no ``Exception`` (``KeyboardInterrupt``,
    ``SystemExit``, ``GeneratorExit``, a ``BaseException`` subclass of its own), carried out
    as the failure it is: answered as any other failure (the JSON 500, with the request's
    id, logged as one line), where raised as it is it would reach the server."""


@contextlib.contextmanager
def _failing_as_an_exception() -> Iterator[None]:
    """What the code run within raises that is no ``Exception`` raised as a
    :class:`_RaisedByEndpoint`; a cancellation (its client left, the server stopping) as it is."""
    try:
        yield
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as exc:
        raise _RaisedByEndpoint(type(exc).__name__) from exc


class EventStreamResponse(StreamingResponse):
    """A stream of Server-Sent Events (documented so in the OpenAPI document), whose source
    is closed as the response ends, however it ends: Starlette leaves it to the garbage
    collector when sending fails (its client left, or its key was revoked)."""

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            source = self.body_iterator
            if isinstance(source, AsyncGenerator):
                with anyio.CancelScope(shield=True):
                    await source.aclose()


def _request_parameters(signature: inspect.Signature) -> list[str]:
    """The parameters of a handler that receive the request itself (``request: Request``)."""
    return [
        name
        for name, parameter in signature.parameters.items()
        if isinstance(parameter.annotation, type) and issubclass(parameter.annotation, Request)
    ]


async def _parsed_the_body(exc: json.JSONDecodeError, requests: list[Request]) -> bool:
    """Whether ``exc`` is the failed JSON parse of the request's body (``await
    request.json()``): a body that is not JSON, which the client is told (422)."""
    for request in requests:
        try:
            if is_parse_of(exc, await request.body()):
                return True
        except RuntimeError:  # its stream read by the handler
            continue
    return False


async def _decoded_the_body(exc: UnicodeDecodeError, requests: list[Request]) -> bool:
    """Whether ``exc`` is the failed decoding of the request's body as it was parsed as JSON
    (``await request.json()``): a body that is not UTF-8 text, which the client is told
    (422)."""
    for request in requests:
        try:
            if exc.object == await request.body():
                return True
        except RuntimeError:  # its stream read by the handler
            continue
    return False


def _streaming(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` (a generator function) as an endpoint returning an SSE response."""

    async def endpoint(*args: Any, **kwargs: Any) -> EventStreamResponse:
        items = handler(*args, **kwargs)

        async def body() -> AsyncIterator[str | bytes]:
            # Whether the response closed the stream (a GeneratorExit at one of its lines),
            # as opposed to the handler raising GeneratorExit.
            closed = False
            try:
                if inspect.isasyncgen(items):
                    async with contextlib.aclosing(_driven(items)) as driven:
                        async for line in driven:
                            try:
                                yield line
                            except GeneratorExit:
                                closed = True
                                raise
                else:
                    lines = _encoded(items)
                    worker = ThreadWorker("agentscope-stream")
                    done = object()
                    try:
                        while (line := await worker.run(next, lines, done)) is not done:
                            try:
                                yield line
                            except GeneratorExit:
                                closed = True
                                raise
                    finally:
                        # A client that left ends the stream early: the generator is closed
                        # in its thread, once the step it may be taking is over (its
                        # ``finally`` may block), even while the response is being cancelled.
                        # A thread cannot be stopped: one still taking its step, or closing
                        # the generator, after CLEANUP_SECONDS is left to go on, the response
                        # ends (nor does a server stopping wait for it).
                        with anyio.move_on_after(CLEANUP_SECONDS, shield=True):
                            await worker.run(_close, lines)
                        worker.close()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                if closed:
                    raise
                # What is no Exception too (KeyboardInterrupt, SystemExit, GeneratorExit, a
                # library's own): leaving the response, the first two would end the server.
                yield _error_item(exc)

        return EventStreamResponse(body())

    # The handler's parameters (annotations resolved in its own module), so FastAPI reads
    # the request the same way; the result is the SSE response.
    signature = inspect.signature(handler, eval_str=True)
    endpoint.__signature__ = signature.replace(  # type: ignore[attr-defined]
        return_annotation=EventStreamResponse
    )
    endpoint.__name__ = getattr(handler, "__name__", "stream")
    endpoint.__doc__ = handler.__doc__
    return endpoint


async def _driven(items: AsyncGenerator[Any, Any]) -> AsyncGenerator[str | bytes, None]:
    """The SSE lines of an async generator's items, the generator run by a task of its own,
    one item at a time as the response asks for them (an error ending it as its error item).

    A client that leaves cancels the response at once, and at each of its awaits after that:
    the task is cancelled once instead, as a canceled run's agent is, so the generator's
    ``finally`` runs to its end, awaits included; one still going :data:`CLEANUP_SECONDS`
    later is cancelled again, cut short, and the response ends without waiting for it.
    """
    handoff: asyncio.Queue[str | bytes | None] = asyncio.Queue(maxsize=1)

    async def drive() -> None:
        try:
            try:
                async for item in items:
                    await handoff.put(_streamed(item))
                    await handoff.join()  # sent: the next item is asked for
            finally:
                await items.aclose()  # ended early: an item JSON cannot carry, or cancelled
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # sys.exit() too: raised out of a task, it stops the loop
            if cancelled_from_outside():  # its client left: no one to tell
                logger.exception("a streamed endpoint failed as it was closed")
                return
            await handoff.put(_error_item(exc))
        await handoff.put(None)

    task = asyncio.create_task(drive())
    _STREAMS.add(task)
    task.add_done_callback(_STREAMS.discard)
    try:
        while (line := await handoff.get()) is not None:
            yield line
            handoff.task_done()
    finally:
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait({task}, timeout=CLEANUP_SECONDS)
            task.cancel()  # its cleanup cut short, if still going


# The tasks running the generators of streams: asyncio refers to a task weakly, and one
# nothing else refers to may be collected while it waits.
_STREAMS: set[asyncio.Task[None]] = set()


def _encoded(items: Iterable[Any]) -> Generator[str | bytes, None, None]:
    """The SSE lines of a sync generator's items (encoded in its worker thread too)."""
    try:
        for item in items:
            yield _streamed(item)
    finally:
        if isinstance(items, Generator):
            items.close()


def _close(lines: Generator[str | bytes, None, None]) -> None:
    """Close a stream's generator; what its ``finally`` raises is logged (the stream is over)."""
    try:
        lines.close()
    except Exception:
        logger.exception("a streamed endpoint failed as it was closed")


def build_router(endpoints: list[dict[str, Any]]) -> APIRouter:
    """A router of the custom endpoints, every one requiring an authenticated caller; the
    process's secrets (:func:`~agentscope_serverless.log.redact`) are kept out of the error
    items of streamed ones."""
    router = APIRouter(
        dependencies=[Depends(current_user_id)], tags=["custom"], route_class=_EndpointRoute
    )
    for spec in endpoints:
        handler = _acting_as_caller(spec["handler"])
        if inspect.isasyncgenfunction(handler) or inspect.isgeneratorfunction(handler):
            router.add_api_route(
                spec["path"],
                _streaming(handler),
                methods=spec["methods"],
                response_class=EventStreamResponse,
            )
        else:
            router.add_api_route(spec["path"], handler, methods=spec["methods"])
    return router


__all__ = ["build_router"]
