"""The project's structured logger: JSON lines on stdout (the standard library only).

Every line carries the request id of the request being served (set once per request by
the HTTP layer), so one request's lines can be found together::

    from agentscope_serverless.log import logger
    logger.info("session created", extra={"session_id": "s1"})

The warnings and errors of libraries that log without a handler (Python's last resort) are
written the same way, and so are Python's warnings (``warnings.warn``) and the exceptions no
thread caught. A line is
``{"level", "location", "message", "timestamp", "service", "request_id", ...extra}``
(with ``exception`` and ``exception_name`` for ``logger.exception``), the shape AWS Lambda
Powertools writes, so log queries keep working. A text value longer than
:data:`MAX_FIELD_CHARS` is cut to its beginning and end (:func:`shortened`): an exception
quoting a client's whole message stays a line of bounded length. The level comes from
``POWERTOOLS_LOG_LEVEL`` (or ``LOG_LEVEL``), the service name from
``POWERTOOLS_SERVICE_NAME``. Never pass keys, tokens or request bodies to the logger; the
secret values of the process (the settings', the agent's own: :func:`redact`) are replaced
by ``***`` in every line all the same, and so are the credentials a URL carries
(``https://user:password@host``: :func:`without_url_credentials`), and anything shaped like
one of our API keys, whoever's it is, by ``ask_***`` (:func:`without_api_keys`). The
server's own lines (uvicorn's access lines and WebSocket lines, which quote a request's path
and query) are masked the same way, whatever writes them (:class:`MaskingFilter`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterable
from typing import TextIO

# The most characters of the path in a request's line (a client chooses it, unauthenticated).
MAX_PATH_CHARS = 1024
# The most characters of any value of a line (an exception's text may quote a whole request):
# a deep traceback takes a few thousand.
MAX_FIELD_CHARS = 16_384

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "agentscope_request_id", default=None
)
# The id the client sent (X-Request-Id) when it is not the request's own (on Lambda).
_client_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "agentscope_client_request_id", default=None
)
# The trace ids of the request (``xray_trace_id``, ``trace_id``: see :func:`trace_ids_of`),
# as the fields of its lines (name, value); empty without any.
_trace_ids: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "agentscope_trace_ids", default=()
)
# uvicorn's records carry their message again with terminal colours, as color_message.
_STANDARD_FIELDS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "color_message"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the request id and the record's ``extra`` fields."""

    def __init__(self, service: str, *, line_end: str = "") -> None:
        super().__init__()
        self.service = service
        self.line_end = line_end

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        moment = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record.created))
        return f"{moment},{int(record.msecs):03d}+0000"

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "level": record.levelname,
            "location": f"{record.funcName}:{record.lineno}",
            "message": record.getMessage(),
            "timestamp": self.formatTime(record),
            "service": self.service,
        }
        request_id = _request_id.get()
        if request_id is not None:
            line["request_id"] = request_id
            client_request_id = _client_request_id.get()
            if client_request_id is not None:
                line["client_request_id"] = client_request_id
        line.update(_trace_ids.get())
        for key, value in record.__dict__.items():
            if key not in _STANDARD_FIELDS and not key.startswith("_"):
                line[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            line["exception"] = self.formatException(record.exc_info)
            line["exception_name"] = record.exc_info[0].__name__
        for key, value in line.items():
            if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
                # Secrets out first: the cut could leave half of one on either side of it.
                line[key] = shortened(redacted(value), MAX_FIELD_CHARS)
        # ASCII: what a client wrote (a terminal's 8-bit escape, a line or paragraph
        # separator, a right-to-left override) is escaped, never read as it is by a terminal
        # or a tool splitting lines; once the JSON is read, the text is whole again.
        return _masked(json.dumps(line, default=str, separators=(",", ":"))) + self.line_end


class _Masking(logging.Formatter):
    """The lines of another formatter (Lambda's JSON ones), with the secrets masked."""

    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.formatter = formatter

    def format(self, record: logging.LogRecord) -> str:
        return _masked(self.formatter.format(record))


def _masked(line: str) -> str:
    """A JSON line with every secret given to :func:`redact` replaced by ``***``, the
    credentials of its URLs by ``****``, and its API keys by ``ask_***``; still JSON: a
    secret is masked in the text of a string, and a bare value holding one (``true``,
    ``5432``: a flag or a port put in the agent's secret) becomes the string ``"***"``."""
    forms = _REDACTED
    if any(form in line for form in forms):
        line = _JSON_TOKEN.sub(_masked_token, line)
    return without_api_keys(without_url_credentials(line))


# A JSON string (with its escapes), or a bare value (a number, true, false, null).
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[^\s"{}\[\],:]+')


def _masked_token(match: re.Match[str]) -> str:
    """The token of a JSON line ``match`` found, with the secrets in it masked."""
    token = match.group()
    if not any(form in token for form in _REDACTED):
        return token
    if not token.startswith('"'):
        return '"***"'
    try:
        text = json.loads(token)
    except ValueError:  # not JSON after all (another formatter's line): masked as text
        return _without_secrets(token)
    # Masked in the text the string holds, then written again: an escape is never cut.
    return json.dumps(_without_secrets(text))


def _without_secrets(text: str) -> str:
    """``text`` with every form of every secret given to :func:`redact` replaced by ``***``."""
    for form in _REDACTED:
        text = text.replace(form, "***")
    return text


# An API key (``ask_<key id>_<secret>``, as auth/keys.py makes them), whoever's it is: a
# library's record quotes what a client sent (a key given as a page size), and a key the
# process only knows by its hash is not among the secrets given to :func:`redact`. Whatever
# follows its id goes too: the secret, or the part of it a cut left.
# A URL quotes one percent-encoded as its client sent it (``?api_key=ask%5F...``, any of
# its characters escaped): each character is matched as it is or as its escape.
_API_KEY = re.compile(
    r"(?:a|%61)(?:s|%73)(?:k|%6[Bb])(?:_|%5[Ff])"
    r"(?:[0-9a-f]|%3[0-9]|%6[1-6]){16}(?:_|%5[Ff])"
    r"(?:[A-Za-z0-9_-]|%[0-9A-Fa-f]{2})+"
)


def without_api_keys(text: str) -> str:
    """``text`` with each API key in it, as it is or percent-encoded, replaced by ``ask_***``.

    >>> without_api_keys("invalid literal for int(): 'ask_44b09d27598e7973_nfkC3x-Yz_q'")
    "invalid literal for int(): 'ask_***'"
    >>> without_api_keys("GET /ws?api_key=ask%5F44b09d27598e7973%5FnfkC3x-Yz%5Fq&page=2")
    'GET /ws?api_key=ask_***&page=2'
    """
    return _API_KEY.sub("ask_***", text) if "ask_" in text or "%" in text else text


# What a URL carries before its host (``user:password@``, a token alone): up to the last @
# before the host's end, not past a quote or a backslash (a JSON line's escapes).
_URL_CREDENTIALS = re.compile(r"(?<=://)[^\s/?#\"'`\\<>]*@")


def without_url_credentials(text: str) -> str:
    """``text`` with the credentials of each URL in it replaced by ``****``, as uv and pip
    show them: a connection string or an index URL quoted by an error keeps its password.

    >>> without_url_credentials("Invalid URL: https://alice:pass-word@pypi.example/simple")
    'Invalid URL: https://****@pypi.example/simple'
    >>> without_url_credentials("redis://:p@ss@cache:6379/0 and https://pypi.org/simple")
    'redis://****@cache:6379/0 and https://pypi.org/simple'
    """
    return _URL_CREDENTIALS.sub("****@", text) if "://" in text else text


# The secret values of the process (the settings', the agent's own), replaced by *** in every
# line (an agent's exception quoting its API key is logged with its traceback) and in the
# errors clients read.
_SECRETS: frozenset[str] = frozenset()
# The forms they take in a text or a line, longest first (a secret holding another is
# replaced whole): as they are, as repr() quotes them (``!r``, a dict or a list printed: a PEM
# key's lines joined by ``\n``, a backslash doubled) and each of those JSON-escaped (a line's
# JSON, a JSON text quoted by an error). A tuple replaced whole, never changed, so a line
# formatted meanwhile in another thread reads it.
_REDACTED: tuple[str, ...] = ()


def _forms(secret: str) -> set[str]:
    r"""The forms ``secret`` takes in a text or a JSON line (see :data:`_REDACTED`).

    >>> sorted(_forms("C:\\temp"), key=len)
    ['C:\\temp', 'C:\\\\temp', 'C:\\\\\\\\temp']
    """
    # repr() of a text holding both quotes escapes its ', as one quoting the secret may.
    quoted = {secret, repr(secret)[1:-1], repr('"' + secret)[2:-1]}
    return quoted | {json.dumps(form)[1:-1] for form in quoted}


# Shorter values are no secrets (a flag, a test's token): masked, each would blot out its
# letters in every text ("at capacity" read "a*** capaci***y" for a token "t"), and show them.
MIN_SECRET_LENGTH = 4


def redact(secrets: Iterable[str]) -> None:
    """Replace each of ``secrets`` (of :data:`MIN_SECRET_LENGTH` characters or more) by
    ``***`` in every line logged from now on, and in the text :func:`redacted` gives (the
    error messages clients read), as it is, as ``repr()`` quotes it, and JSON-escaped."""
    global _SECRETS, _REDACTED
    known = _SECRETS | {secret for secret in secrets if len(secret) >= MIN_SECRET_LENGTH}
    if known == _SECRETS:
        return
    forms = set().union(*(_forms(secret) for secret in known))
    _SECRETS, _REDACTED = known, tuple(sorted(forms, key=len, reverse=True))


# The AWS SDK's credentials in the environment (a Lambda function's role gets them there):
# at DEBUG, botocore logs the headers of each request it signs, the session token among them.
AWS_CREDENTIAL_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# Shorter values are no real credentials (moto's "testing"): masked, they would blot out words.
_MIN_AWS_SECRET_CHARS = 16


def redact_aws_credentials() -> None:
    """:func:`redact` the AWS credentials of the environment (:data:`AWS_CREDENTIAL_VARIABLES`)."""
    values = (os.environ.get(name, "") for name in AWS_CREDENTIAL_VARIABLES)
    redact(value for value in values if len(value) >= _MIN_AWS_SECRET_CHARS)


def redacted(text: str) -> str:
    """``text`` with every secret given to :func:`redact` replaced by ``***``, the
    credentials of its URLs by ``****`` (:func:`without_url_credentials`), and its API keys
    by ``ask_***`` (:func:`without_api_keys`).

    >>> redact(["sk-example-key"])
    >>> redacted("the key sk-example-key was refused by https://bot:pw@api.example")
    'the key *** was refused by https://****@api.example'
    """
    return without_api_keys(without_url_credentials(_without_secrets(text)))


class _StdoutHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the ``sys.stdout`` of the moment (a test or a server may replace it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stdout
        super().emit(record)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the ``sys.stderr`` of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


# The variables the log level is read from, the first one set wins (Powertools' own first).
LOG_LEVEL_VARIABLES = ("POWERTOOLS_LOG_LEVEL", "LOG_LEVEL")
_LEVEL_NAMES = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _level() -> int:
    return _configured_level()[0]


def _configured_level() -> tuple[int, str | None]:
    """The log level :data:`LOG_LEVEL_VARIABLES` ask for (in any case), and when the one set
    names none (a typo, or white space around it, as a Windows line ending leaves), INFO with
    what to warn of: the level is read as the logger is made, before any settings are."""
    for variable in LOG_LEVEL_VARIABLES:
        value = os.environ.get(variable)
        if value:
            break
    else:
        return logging.INFO, None
    # Only the five documented: logging also knows NOTSET (which leaves the level to the
    # root logger's, WARNING), WARN and FATAL.
    if value.upper() in _LEVEL_NAMES:
        return logging.getLevelNamesMapping()[value.upper()], None
    problem = (
        "begins or ends with white space, such as the \\r a Windows line ending leaves (remove it)"
        if value.strip().upper() in _LEVEL_NAMES
        else f"is no log level (give {', '.join(_LEVEL_NAMES[:-1])} or {_LEVEL_NAMES[-1]})"
    )
    return logging.INFO, f"{variable}={value!r} {problem}: logging at INFO"


SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME") or "agentscope-serverless"


def _make_logger() -> logging.Logger:
    log = logging.getLogger("agentscope_serverless")
    log.setLevel(_level())
    if not log.handlers:
        handler = _StdoutHandler(sys.stdout)
        handler.setFormatter(JsonFormatter(SERVICE))
        log.addHandler(handler)
    log.propagate = False
    return log


logger = _make_logger()
if (_level_problem := _configured_level()[1]) is not None:
    logger.warning(_level_problem)


def _take_unhandled_records() -> None:
    """Write the warnings and errors of libraries whose logging nobody configured (the A2A
    SDK's, Mangum's) as lines of ours: JSON with the request id, secrets masked, values
    bounded. Python's default writes them as plain text, a traceback as a line per line,
    with what a client sent as it is. They still go to stderr, as by default (a command's
    output stays its own). A process that configures its logging (a handler on the root
    logger) keeps its own way."""
    if logging.lastResort is None:  # silenced on purpose
        return
    handler = _StderrHandler(sys.stderr)
    handler.setLevel(max(logging.WARNING, _level()))
    handler.setFormatter(JsonFormatter(SERVICE))
    logging.lastResort = handler


_take_unhandled_records()


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """Python's hook of an exception no thread caught, writing it as one line of ours."""
    if issubclass(args.exc_type, SystemExit):
        return  # a thread's way to end, as Python's own hook has it
    exc_info = (
        None if args.exc_value is None else (args.exc_type, args.exc_value, args.exc_traceback)
    )
    logger.error(
        "an exception was raised in a thread",
        exc_info=exc_info,
        extra={"thread_name": None if args.thread is None else args.thread.name},
    )


_show_warning_as_text = warnings.showwarning


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Python's way of showing a warning (``warnings.showwarning``), writing it as a record
    of the ``py.warnings`` logger (as ``logging.captureWarnings`` does, but with no handler
    of its own: the record reaches the root logger's, else Python's last resort, ours)."""
    if file is not None:  # asked for in a file of its own
        _show_warning_as_text(message, category, filename, lineno, file, line)
        return
    logging.getLogger("py.warnings").warning(
        str(message), extra={"category": category.__name__, "warned_at": f"{filename}:{lineno}"}
    )


def _take_warnings_and_thread_errors() -> None:
    """Write Python's warnings (``warnings.warn`` in an agent) and the exceptions no thread
    caught as lines of ours, one each, instead of text on stderr of a line per line, each
    its own event in CloudWatch: a warning in a request with the request's id, a thread's
    exception with the thread's name (a thread starts without the context of the request
    that started it). Hooks a process installed of its own are kept."""
    if warnings.showwarning is _show_warning_as_text:
        warnings.showwarning = _log_warning
    if threading.excepthook is threading.__excepthook__:
        threading.excepthook = _log_thread_exception


_take_warnings_and_thread_errors()


# The loggers of the server (uvicorn): its access lines and its WebSocket lines quote a
# request's path and query, where a client may have put a key (``?token=ask_...``), and at
# the trace level its ASGI messages quote a request's headers (``Authorization``).
SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class MaskingFilter(logging.Filter):
    """Masks a record as our own lines are (:func:`redacted`: the secrets of the process,
    the credentials of a URL, API keys), whatever handler and formatter write it: its
    message, its arguments (uvicorn's access line is formatted from them) and its traceback.

    >>> record = logging.LogRecord("uvicorn.access", 20, "", 0, '"%s %s" %d',
    ...                            ("GET", "/state?token=ask_83549bb5c909093f_kU18h", 401), None)
    >>> MaskingFilter().filter(record), record.getMessage()
    (True, '"GET /state?token=ask_***" 401')
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = _masked_argument(record.msg)
        color_message = record.__dict__.get("color_message")
        if isinstance(color_message, str):
            record.color_message = redacted(color_message)
        if isinstance(record.args, tuple):
            record.args = tuple(_masked_argument(argument) for argument in record.args)
        elif isinstance(record.args, dict):
            record.args = {name: _masked_argument(value) for name, value in record.args.items()}
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            record.exc_text = redacted(_TRACEBACKS.formatException(record.exc_info))
        return True


_TRACEBACKS = logging.Formatter()


def _masked_argument(argument: object) -> object:
    """A record's argument, masked: a number stays one (``%d`` formats it), and anything
    else whose text holds a secret becomes that text, masked."""
    if argument is None or isinstance(argument, int | float):
        return argument
    argument = _masked_frame(argument)
    text = argument if isinstance(argument, str) else str(argument)
    masked = redacted(text)
    return argument if masked == text else masked


# Whether the WebSocket handshake the current task serves was refused with an HTTP answer.
_handshake_refused: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "agentscope_handshake_refused", default=False
)
# What uvicorn logs (an ERROR) of a WebSocket connection whose application returned before
# it answered the handshake.
_UNANSWERED_HANDSHAKE = "ASGI callable returned without completing handshake."


def handshake_refused() -> None:
    """Note that the WebSocket handshake the current task serves was refused with a whole
    HTTP answer (a 401 and its JSON error, say)."""
    _handshake_refused.set(True)


class _RefusedHandshakeFilter(logging.Filter):
    """Drops uvicorn's ERROR of a handshake left unanswered when it was refused with an HTTP
    answer: its sans-I/O and wsproto servers never count such an answer (the ASGI
    ``websocket.http.response`` extension's) as the handshake's, and log one per refusal.
    The record is made as the application returns, in its task: the task's note is seen."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == _UNANSWERED_HANDSHAKE and _handshake_refused.get())


def _masked_frame(argument: object) -> object:
    """``argument``, or when it is a WebSocket frame (websockets' ``Frame``, which the server's
    debug lines quote) the frame with the secrets of its payload masked: its text shows a
    long payload's beginning and end only, and masked after the cut, a key's end would stay."""
    frames = sys.modules.get("websockets.frames")  # none made before websockets is imported
    if frames is None or not isinstance(argument, frames.Frame):
        return argument
    # Bytes that are not UTF-8 (a binary frame's) are kept as they are, around what is masked.
    payload = bytes(argument.data).decode("utf-8", "surrogateescape")
    masked = redacted(payload)
    if masked == payload:
        return argument
    return dataclasses.replace(argument, data=masked.encode("utf-8", "surrogateescape"))


def _mask_server_records() -> None:
    """Mask every record of the server's loggers (:data:`SERVER_LOGGERS`), whichever
    handlers a server configures for them: a filter of the logger a record is made on,
    which its logging configuration (uvicorn's ``dictConfig``) keeps. uvicorn's ERROR of
    a refused handshake is dropped (:class:`_RefusedHandshakeFilter`)."""
    for name in SERVER_LOGGERS:
        server_logger = logging.getLogger(name)
        if not any(isinstance(known, MaskingFilter) for known in server_logger.filters):
            server_logger.addFilter(MaskingFilter())
    errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(known, _RefusedHandshakeFilter) for known in errors.filters):
        errors.addFilter(_RefusedHandshakeFilter())


_mask_server_records()


def format_as_json(*names: str) -> None:
    """Write the records of the loggers ``names`` (the root logger without any) as lines of
    ours: the handlers a host gave them keep their destination, with our JSON (secrets
    masked). The Lambda runtime writes the root logger's records (every library's, the
    agent's own) as plain text lines, and uvicorn its own records, in CloudWatch beside
    our JSON ones (with the function's log format JSON, its own JSON lines, whose secrets
    are masked all the same)."""
    for name in names or ("",):
        for handler in logging.getLogger(name or None).handlers:
            formatter = handler.formatter
            if isinstance(formatter, JsonFormatter | _Masking):
                continue
            if formatter is not None and type(formatter).__name__ == "JsonFormatter":
                # Lambda's, with the function's log format JSON: kept (its fields are the
                # ones CloudWatch reads), with the secrets masked.
                handler.setFormatter(_Masking(formatter))
                continue
            # A stream handler ends each line itself; Lambda's writes the text it is given.
            line_end = "" if isinstance(handler, logging.StreamHandler) else "\n"
            handler.setFormatter(JsonFormatter(SERVICE, line_end=line_end))


def shortened(text: str, limit: int) -> str:
    """``text``, or when longer than ``limit`` characters its beginning and its end around a
    note of how many characters were cut.

    >>> shortened("abcdefghij", 4)
    'ab...[6 characters cut]...ij'
    """
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}...[{len(text) - 2 * half} characters cut]...{text[-half:]}"


def bind_request_id(
    request_id: str | None,
    client_request_id: str | None = None,
    *,
    trace_ids: dict[str, str] | None = None,
) -> None:
    """Tag every line logged by the current task (and tasks it starts) with ``request_id``
    (None: no request's), ``client_request_id``, the id the client sent, when it is
    another, and the fields of ``trace_ids`` (:func:`trace_ids_of`)."""
    _request_id.set(request_id)
    _client_request_id.set(client_request_id)
    _trace_ids.set(tuple(trace_ids.items()) if trace_ids else ())


# An X-Ray trace id (``1-<8 hex digits of its time>-<24 hex digits>``) and a W3C
# ``traceparent`` (``<version>-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``, a later
# version possibly followed by more fields).
_XRAY_TRACE_ID = re.compile(r"1-[0-9a-f]{8}-[0-9a-f]{24}")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-.*)?", re.S)


def trace_ids_of(x_amzn_trace_id: str | None, traceparent: str | None) -> dict[str, str]:
    """The trace ids to log, as Powertools names them: ``xray_trace_id``, the ``Root`` of
    an ``X-Amzn-Trace-Id`` (a header, or Lambda's ``_X_AMZN_TRACE_ID``), and ``trace_id``, the
    trace id of a valid W3C ``traceparent``. A value that is not one is left out.

    >>> ids = trace_ids_of("Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",
    ...                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    >>> ids["xray_trace_id"], ids["trace_id"]
    ('1-5759e988-bd862e3fe1be46a994272793', '0af7651916cd43dd8448eb211c80319c')
    >>> trace_ids_of("Root=nonsense", "00-" + "0" * 32 + "-b7ad6b7169203331-01")
    {}
    """
    found: dict[str, str] = {}
    if x_amzn_trace_id:
        for part in x_amzn_trace_id.split(";"):
            name, _, value = part.strip().partition("=")
            if name == "Root" and _XRAY_TRACE_ID.fullmatch(value):
                found["xray_trace_id"] = value
                break
    if traceparent:
        match = _TRACEPARENT.fullmatch(traceparent.strip())
        if match is not None:
            version, trace_id, parent_id, more = match.groups()
            valid = (
                version != "ff"
                and not (version == "00" and more)
                and trace_id != "0" * 32
                and parent_id != "0" * 16
            )
            if valid:
                found["trace_id"] = trace_id
    return found


def current_request_id() -> str | None:
    """The request id bound to the current task (None outside a request)."""
    return _request_id.get()


def log_request(
    request_id: str,
    method: str | None,
    path: str | None,
    status: int,
    duration_ms: float,
    *,
    client_request_id: str | None = None,
    failure: dict[str, str] | None = None,
) -> None:
    """The one line logged per request, with the keys of the logger's lines, the id the
    client sent when it is another (``client_request_id``), and for a failed request what
    ``failure`` says of it (the error ``code``, the caller's ``user_id`` and ``key_id``).

    It is on every request, so it is built only when INFO is enabled and written as one
    ``json.dumps`` to stdout, without the logging machinery (which costs ten times more).
    Never pass it anything from the request but these fields.
    """
    if logger.getEffectiveLevel() > logging.INFO:
        return
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now))
    line = {
        "level": "INFO",
        "location": "request",
        "message": "request",
        "timestamp": f"{stamp},{int(now * 1000) % 1000:03d}+0000",
        "service": SERVICE,
        "request_id": request_id,
        "method": method,
        "path": path if path is None else shortened(without_api_keys(path), MAX_PATH_CHARS),
        "status": status,
        "duration_ms": duration_ms,
    }
    if client_request_id is not None:
        line["client_request_id"] = client_request_id
    line.update(_trace_ids.get())
    if failure:
        line.update(failure)
    # A key sent as the request's id (a valid one: letters, digits and "_") is masked too.
    sys.stdout.write(without_api_keys(json.dumps(line, separators=(",", ":"))) + "\n")
    sys.stdout.flush()


__all__ = [
    "AWS_CREDENTIAL_VARIABLES",
    "MAX_FIELD_CHARS",
    "MAX_PATH_CHARS",
    "MIN_SECRET_LENGTH",
    "SERVER_LOGGERS",
    "SERVICE",
    "JsonFormatter",
    "MaskingFilter",
    "bind_request_id",
    "current_request_id",
    "format_as_json",
    "handshake_refused",
    "log_request",
    "logger",
    "redact",
    "redact_aws_credentials",
    "redacted",
    "shortened",
    "trace_ids_of",
    "without_api_keys",
    "without_url_credentials",
]
