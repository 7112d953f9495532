"""The ``agentscope-serverless`` command: run a local server, talk to it, manage API keys.

::

    agentscope-serverless init my-agent              # a project folder: agent, test, README
    agentscope-serverless serve                      # every router; demo agent; in-memory stores
    agentscope-serverless serve --agent my_agent.agent:app --reload   # from the project folder
    agentscope-serverless serve --stack              # ... on local Redis and DynamoDB (moto)
    agentscope-serverless invoke "My name is Alice" --session demo --key ask_...
    agentscope-serverless chat --key ask_...
    agentscope-serverless keys create --user alice   # prints the key once; stores its hash
    agentscope-serverless keys list
    agentscope-serverless keys revoke KEY_ID
    agentscope-serverless deploy sam deploy --stack-name my-agent   # see deploy --help

Client commands read the server URL from ``AGENTSCOPE_URL`` and the key from
``AGENTSCOPE_API_KEY`` when not given. ``keys`` commands manage the key file
(``AUTH_KEYS_FILE``, or ``--file``; a server uses it with ``AUTH_KEYS_BACKEND=file``), or a
deployed stack's DynamoDB key table (``--table``, or ``AUTH_KEYS_BACKEND=dynamodb`` with
``AUTH_KEYS_TABLE``; AWS credentials and region from the usual AWS settings)::

    agentscope-serverless keys create --user alice --table <ApiKeysTableName output>
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar
from urllib.parse import quote

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentscope_serverless.deploy_cli import deploy_app
from agentscope_serverless.errors import AgentScopeServerlessError
from agentscope_serverless.serve import (
    IGNORED_FOLDERS_TEXT,
    LOG_LEVELS,
    WATCHED_FILES,
    listen_options_problem,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping

    import httpx
    import uvicorn
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from agentscope_serverless.auth.base import KeyStore
    from agentscope_serverless.settings import Settings

URL_ENV = "AGENTSCOPE_URL"
KEY_ENV = "AGENTSCOPE_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8090"

app = typer.Typer(
    help="AgentScope Serverless: serve agents as HTTP APIs, talk to them, manage API keys, deploy.",
    no_args_is_help=True,
    add_completion=False,
)
keys_app = typer.Typer(
    help="Manage API keys in the key file or a DynamoDB key table (only hashes are stored).",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="keys")
app.add_typer(deploy_app, name="deploy")

# The terminal's control characters but line breaks and tabs (carriage returns Rich drops),
# shown as escapes: ESC starts sequences that set the clipboard (OSC 52), the window's title or
# a link's target, or clear the screen; C1 characters are their one-character forms.
_CONTROLS = {
    code: f"\\x{code:02x}"
    for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))
    if chr(code) not in "\t\n\r"
}


class TerminalConsole(Console):
    """A console printing text from elsewhere (an agent's reply or error, a user id) as it is,
    without emoji codes, and never as terminal control sequences."""

    def render_str(self, text: str, **kwargs: Any) -> Any:
        return super().render_str(text.translate(_CONTROLS), **kwargs)


console = TerminalConsole(soft_wrap=True, highlight=False, emoji=False)
errors = TerminalConsole(stderr=True, soft_wrap=True, highlight=False, emoji=False)

UrlOption = Annotated[str, typer.Option("--url", envvar=URL_ENV, help="The server's base URL.")]
KeyOption = Annotated[
    str | None, typer.Option("--key", envvar=KEY_ENV, help="Your API key (ask_...).")
]
SessionOption = Annotated[
    str | None, typer.Option("--session", help="Continue this session (default: a new one).")
]
UserOption = Annotated[
    str | None, typer.Option("--user", help="With a service key: the user to act for.")
]
FileOption = Annotated[
    Path | None, typer.Option("--file", help="The key file (default: AUTH_KEYS_FILE).")
]
TableOption = Annotated[
    str | None,
    typer.Option(
        "--table",
        help="A DynamoDB key table (default with AUTH_KEYS_BACKEND=dynamodb: AUTH_KEYS_TABLE).",
    ),
]


class CommandError(Exception):
    """A failure to report to the user in one line."""


class CannotTalk(CommandError):
    """A failure no message typed can fix (a wrong key or URL, a server not reached): a chat
    ends on it."""


class ReplyFailed(CommandError):
    """A reply that started and then failed or was cut off: its session exists (the input
    is kept in it), and a chat goes on in it."""

    def __init__(self, message: str, session_id: str | None) -> None:
        super().__init__(message)
        self.session_id = session_id


class ReplyInterrupted(Exception):
    """Ctrl-C while a reply streamed: its run was asked to stop."""

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.session_id = session_id


def _fail(message: str, code: int = 1) -> NoReturn:
    errors.print(f"[bold red]error:[/bold red] {escape(message)}", markup=True)
    raise typer.Exit(code)


# The help as --help shows it: plain text, each paragraph on one line for Rich to wrap.
SERVE_HELP = (
    "Run every router in one local server (settings and env pick the backends).\n\n"
    "--agent is imported from the working directory (or --app-dir). On the embedded defaults "
    "(in-memory stores and keys, the demo agent) a development key is created and printed; it "
    "lasts as long as the server. The port is taken first, so a port in use fails before any "
    "key or command is printed."
)


@app.command(help=SERVE_HELP)
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    # Checked below rather than by a range: a range's type column squeezes the help column of
    # --help in an 80-column terminal until it cuts words.
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8090,
    agent: Annotated[
        str | None, typer.Option(help="The AgentApp to serve, as module:attribute.")
    ] = None,
    dev_user: Annotated[
        str, typer.Option(help="The user of the development key (in-memory key store).")
    ] = "dev",
    log_level: Annotated[
        str, typer.Option(help="uvicorn's log level: " + ", ".join(LOG_LEVELS) + ".")
    ] = "info",
    stack: Annotated[
        bool,
        typer.Option(
            "--stack",
            help="Run on the local emulation stack: Redis and moto's DynamoDB on loopback "
            "(needs redis-server and the dev dependencies); a store's backend set in the "
            "environment (SESSION_HISTORY_BACKEND, MEMORY_BACKEND, STATE_BACKEND) is kept.",
        ),
    ] = False,
    web: Annotated[
        bool | None,
        typer.Option(
            "--web/--no-web", help="Serve the chat page at / (default: WEB_UI if set, else on)."
        ),
    ] = None,
    app_dir: Annotated[
        Path,
        typer.Option("--app-dir", help="Import the agent's modules from here (as uvicorn does)."),
    ] = Path(),
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            help=f"Restart when {WATCHED_FILES} of --app-dir changes (not in "
            f"{IGNORED_FOLDERS_TEXT}).",
        ),
    ] = False,
    header_timeout: Annotated[
        float | None,
        typer.Option(
            "--header-timeout",
            help="Seconds a client has to send a request's line and headers before its "
            "connection is closed (default: REQUEST_HEAD_TIMEOUT_SECONDS, 15).",
        ),
    ] = None,
) -> None:
    """Run every router in one local server (settings and env pick the backends)."""
    if problem := listen_options_problem(port, log_level):
        _fail(problem, code=2)
    log_level = log_level.lower()
    if agent is not None and not agent.strip():  # --agent "$AGENT" of a variable not set
        _fail(
            "--agent is empty (a variable not set?): give the AgentApp as module:attribute, "
            "e.g. mypkg.agent:app, or leave --agent out for AGENT_APP or the demo agent",
            code=2,
        )
    from agentscope_serverless.settings import agent_app_problem

    if agent is not None and (problem := agent_app_problem(agent)):
        _fail(f"--agent {agent!r}: {problem}", code=2)
    if not app_dir.is_dir():
        _fail(f"--app-dir {app_dir}: no such folder ({app_dir.absolute()})", code=2)
    if header_timeout is not None and not 0 < header_timeout < math.inf:
        _fail(
            f"--header-timeout must be a finite number of seconds above 0, not {header_timeout}",
            code=2,
        )
    overrides = {} if header_timeout is None else {"request_head_timeout_seconds": header_timeout}
    if web is None and not os.environ.get("WEB_UI", "").strip():
        web = True  # unset (or empty), WEB_UI is off: the local server shows the page
    # uvicorn re-raises SIGTERM after its graceful shutdown; as an exception (not the default
    # handler's instant exit) it unwinds this block, so the local stack is stopped too.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with contextlib.ExitStack() as resources:
        listener = resources.enter_context(_listen(host, port))
        if stack:
            from agentscope_serverless.local_stack import LocalStack

            try:
                local = resources.enter_context(LocalStack(progress=_report_progress))
            except AgentScopeServerlessError as exc:
                _fail(exc.message, code=2)
            # Environment, not settings overrides: the AWS SDK reads its credentials there.
            os.environ.update(_stack_environment(local.environment(), os.environ))
        if reload:
            port = listener.getsockname()[1]  # the one taken for --port 0
            listener.close()  # the port is free: uvicorn's reloader binds it again
            _serve_reloading(
                host, port, agent, dev_user, log_level, app_dir, resources, web=web, **overrides
            )
        else:
            _serve(listener, host, agent, dev_user, log_level, app_dir, web=web, **overrides)


# The variables choosing a store's backend: one set in the environment wins over the stack's.
CHOSEN_BACKENDS = ("SESSION_HISTORY_BACKEND", "MEMORY_BACKEND", "STATE_BACKEND")


def _stack_environment(stack: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The local stack's environment, but for the backends ``environ`` chooses itself.

    >>> stack = {"STATE_BACKEND": "dynamodb", "REDIS_URL": "redis://127.0.0.1:6390"}
    >>> _stack_environment(stack, {"STATE_BACKEND": "redis"})
    {'REDIS_URL': 'redis://127.0.0.1:6390'}
    """
    return {
        name: value
        for name, value in stack.items()
        if not (name in CHOSEN_BACKENDS and environ.get(name, "").strip())
    }


def _report_progress(message: str) -> None:
    console.print(f"{message}...", markup=False, style="dim")


@app.command()
def init(
    name: Annotated[str, typer.Argument(help="The project's folder (and package) name.")],
) -> None:
    """Create a project: an agent module, requirements.txt, a test and a README."""
    from agentscope_serverless.packaging.scaffold import write_project

    target = Path(name)
    try:
        agent = write_project(target)
    except AgentScopeServerlessError as exc:
        _fail(exc.message, code=2)
    console.print(f"[bold green]Created[/bold green] {escape(f'{target}/ with the agent {agent}')}")
    console.print(
        f"cd {shlex.quote(str(target))} && {_own_command()} serve --agent {agent}", markup=False
    )


def _own_command() -> str:
    """How this command is run from another folder: its name when it is on ``PATH``, else
    its path (a virtualenv not activated)."""
    here = Path(sys.executable).with_name("agentscope-serverless")
    if shutil.which("agentscope-serverless") or not here.is_file():
        return "agentscope-serverless"
    return shlex.quote(str(here))


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, or a one-line error when the port is taken."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, kind, proto)
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", code=2)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(2048)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            free = _free_port_after(address, family, port)
            hint = f", e.g. --port {free}" if free is not None else ""
            _fail(
                f"port {port} on {host} is already in use (another server?); "
                f"pick another with --port{hint}",
                code=2,
            )
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", code=2)
    return listener


def _free_port_after(address: Any, family: int, port: int) -> int | None:
    """The first of the next 20 ports that ``address`` (a taken port's) can bind, if any."""
    for candidate in range(port + 1, min(port + 21, 65536)):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address[0], candidate, *address[2:]))
            except OSError:
                continue
            return candidate
    return None


def command_path() -> str:
    """How to run this console script from the current directory, ready to paste.

    The bare name when the shell finds this very script on ``PATH``; otherwise its path
    (relative when it is below the current directory, like ``.venv/bin/agentscope-serverless``).
    """
    script = Path(sys.executable).parent / "agentscope-serverless"
    if not script.exists():
        return f"{shlex.quote(sys.executable)} -m agentscope_serverless.cli"
    found = shutil.which("agentscope-serverless")
    if found is not None and Path(found).resolve() == script.resolve():
        return "agentscope-serverless"
    with contextlib.suppress(ValueError):
        return shlex.quote(str(script.relative_to(Path.cwd())))
    return shlex.quote(str(script))


def _serve(
    listener: socket.socket,
    host: str,
    agent: str | None,
    dev_user: str,
    log_level: str,
    app_dir: Path,
    *,
    web: bool | None,
    **overrides: object,
) -> None:
    import uvicorn

    from agentscope_serverless.head_timeout import head_timeout_protocol
    from agentscope_serverless.serve import (
        STOP_GRACE_SECONDS,
        build,
        development_key,
        root_settings,
        use_app_dir,
    )
    from agentscope_serverless.stopping_server import StoppingServer

    use_app_dir(app_dir)
    try:
        web_ui = {} if web is None else {"web_ui": web}  # None: WEB_UI's
        served = build(root_settings(agent, **web_ui, **overrides))
        dev_key = development_key(served.key_store, dev_user)
    except AgentScopeServerlessError as exc:
        _fail(exc.message, code=2)
    port = listener.getsockname()[1]
    protocol = head_timeout_protocol(
        served.settings.request_head_timeout_seconds,
        served.settings.request_body_timeout_seconds,
    )
    # Said once the app started: a failing start (an @app.init hook) shows its error alone,
    # no key or commands for a server that is not there.
    announced = _AnnouncedOnStart(
        served.app, lambda: _announce(host, port, served.settings, dev_key, dev_user)
    )
    config = uvicorn.Config(
        announced,
        http=protocol,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=STOP_GRACE_SECONDS,
    )
    _run_until_signalled(StoppingServer(config), listener)


class _AnnouncedOnStart:
    """``app``, calling ``announce`` as its start (lifespan) completes."""

    def __init__(self, app: ASGIApp, announce: Callable[[], None]) -> None:
        self.app = app
        self.announce = announce

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def announcing(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                self.announce()
            await send(message)

        await self.app(scope, receive, announcing)


def _run_until_signalled(server: uvicorn.Server, listener: socket.socket) -> None:
    """Run ``server`` on ``listener``; a SIGTERM stops it gracefully, then exits 143.

    From here on the signal only asks the server to stop: raised as an exception while
    uvicorn sets up (before it takes the signal over, or after it gives it back), it could
    interrupt a lock's holder and leave the process unable to exit. (Asked again while it
    stops, a :class:`~agentscope_serverless.stopping_server.StoppingServer` stops at once.)
    """
    received: list[int] = []

    def stop(signum: int, frame: object) -> None:
        received.append(signum)
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    try:
        server.run(sockets=[listener])
    finally:
        signal.signal(signal.SIGTERM, _exit_on_signal)
    if received:
        raise SystemExit(128 + received[0])


def _serve_reloading(
    host: str,
    port: int,
    agent: str | None,
    dev_user: str,
    log_level: str,
    app_dir: Path,
    resources: contextlib.ExitStack,
    *,
    web: bool | None,
    **overrides: object,
) -> None:
    """A reloader (:class:`~agentscope_serverless.reloader.ProjectReload`): a worker process
    builds the app (``serve.create``) at each change of the project's files.

    Keys must outlive the workers: an in-memory key store becomes a key file in a temporary
    directory, which holds the development key.
    """
    import tempfile

    import uvicorn

    from agentscope_serverless.auth import FileKeyStore
    from agentscope_serverless.head_timeout import head_timeout_protocol
    from agentscope_serverless.serve import (
        APP_DIR_ENV,
        STOP_GRACE_SECONDS,
        root_settings,
        use_app_dir,
    )
    from agentscope_serverless.stopping_server import StoppingServer

    try:
        from agentscope_serverless.reloader import LoadingWorker, ProjectReload, stop_signal_exit
    except ImportError as exc:
        _fail(f"--reload needs {exc.name}: pip install 'agentscope-serverless[cli]'", code=2)

    directory = use_app_dir(app_dir)
    os.environ[APP_DIR_ENV] = str(directory)
    if web is not None:
        os.environ["WEB_UI"] = "true" if web else "false"
    if agent:
        os.environ["AGENT_APP"] = agent
    try:
        settings = root_settings(agent, **overrides)
        dev_key = None
        if settings.auth_keys_backend == "in_memory":
            keys_dir = Path(resources.enter_context(tempfile.TemporaryDirectory()))
            os.environ.update(
                {"AUTH_KEYS_BACKEND": "file", "AUTH_KEYS_FILE": str(keys_dir / "keys.json")}
            )
            dev_key = asyncio.run(_create_dev_key(FileKeyStore(keys_dir / "keys.json"), dev_user))
    except AgentScopeServerlessError as exc:
        _fail(exc.message, code=2)
    _announce(host, port, settings, dev_key, dev_user)
    config = uvicorn.Config(
        "agentscope_serverless.serve:create",
        factory=True,
        reload=True,
        reload_dirs=[str(directory)],
        host=host,
        port=port,
        http=head_timeout_protocol(
            settings.request_head_timeout_seconds, settings.request_body_timeout_seconds
        ),
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=STOP_GRACE_SECONDS,
    )
    # The reloader relays a stop to its worker (as SIGTERM), a Ctrl-C included.
    worker = LoadingWorker(StoppingServer(config, interrupted=False))
    reloader = ProjectReload(config, worker.run, [config.bind_socket()], root=directory)
    reloader.run()
    stop_signal_exit(reloader.stopped_by)


def _announce(host: str, port: int, settings: Settings, dev_key: str | None, dev_user: str) -> None:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104
    base = f"http://{f'[{shown}]' if ':' in shown else shown}:{port}"
    console.print(
        f"[bold]AgentScope Serverless[/bold] {escape(f'on {base}  (API docs: {base}/docs)')}"
    )
    if settings.web_ui:
        console.print(f"chat page: {base}/", markup=False)
    console.print(f"agent: {settings.agent_app}", markup=False)
    console.print(
        f"stores: session history {settings.session_history_backend}, memory "
        f"{settings.memory_backend}, state {settings.state_backend}, "
        f"keys {settings.auth_keys_backend}",
        markup=False,
    )
    if dev_key is None:
        where, option = str(settings.auth_keys_file), ""
        if settings.auth_keys_backend == "dynamodb":
            table = settings.auth_keys_table
            where, option = f"the DynamoDB table {table}", f" --table {shlex.quote(table)}"
        console.print(
            f"API keys: {where} (make one with: {command_path()} keys create --user alice{option})",
            markup=False,
        )
    else:
        console.print(f"[bold green]development key[/bold green] {escape(f'(user {dev_user!r}):')}")
        console.print(dev_key, markup=False)
        console.print("\n[bold]Try it:[/bold]")
        for line in _curl_examples(base, dev_key):
            console.print(line, markup=False)


async def _create_dev_key(key_store: Any, user: str) -> str:
    await key_store.start()
    issued = await key_store.create_key(kind="user", user_id=user)
    key: str = issued.key
    return key


def _curl_examples(base: str, key: str) -> list[str]:
    lines = []
    for text in ("My name is Alice", "What is my name?"):
        body = json.dumps({"input": [{"role": "user", "content": text}], "session_id": "demo"})
        lines.append(
            f"curl -N {base}/process -H 'Authorization: Bearer {key}' "
            f"-H 'Content-Type: application/json' -d {shlex.quote(body)}"
        )
    lines.append(f"{command_path()} chat --url {base} --key {key}")
    return lines


@app.command()
def invoke(
    message: Annotated[str, typer.Argument(help="What to say to the agent.")],
    url: UrlOption = DEFAULT_URL,
    key: KeyOption = None,
    session: SessionOption = None,
    user: UserOption = None,
) -> None:
    """Send one message to a running server and print the streamed reply."""
    from agentscope_serverless.services._validation import is_blank_text

    # Stored, it would reach the model with every later turn; the server refuses it (422).
    if is_blank_text(message):
        _fail("the message is blank: say something to the agent", code=2)
    _check_url(url)
    api_key = _require_key(key)
    with _talk_client(url) as client:
        try:
            _check_text(message=message, session=session, user=user)
            session_id = _stream_reply(client, api_key, message, session, user)
        except CommandError as exc:
            _fail(str(exc))
        except ReplyInterrupted as stopped:
            if stopped.session_id:
                console.print(f"session: {stopped.session_id}", style="dim", markup=False)
            raise typer.Exit(130) from None
    console.print(f"session: {session_id}", style="dim", markup=False)


@app.command()
def chat(
    url: UrlOption = DEFAULT_URL,
    key: KeyOption = None,
    session: SessionOption = None,
    user: UserOption = None,
) -> None:
    """Chat with a running server, one session, until /exit or end of input."""
    from agentscope_serverless.services._validation import is_blank_text

    _check_url(url)
    api_key = _require_key(key)
    try:
        _check_text(session=session, user=user)
    except CommandError as exc:
        _fail(str(exc))
    console.print(f"Chatting with {url}; type /exit (or Ctrl-D) to leave.", markup=False)
    failure = None
    with _talk_client(url) as client:
        while True:
            try:
                text = console.input("[bold green]you>[/bold green] ").strip()
            except (EOFError, KeyboardInterrupt):
                console.print()
                break
            if text in ("/exit", "/quit"):
                break
            if is_blank_text(text):  # invisible characters too: the server would refuse them
                continue
            try:
                _check_text(message=text)
                console.print("[bold blue]agent>[/bold blue] ", end="")
                session = _stream_reply(client, api_key, text, session, user)
            except CannotTalk as exc:
                failure = str(exc)
                break
            except CommandError as exc:
                errors.print(f"[bold red]error:[/bold red] {escape(str(exc))}")
                if isinstance(exc, ReplyFailed):  # the chat goes on in the reply's session
                    session = exc.session_id or session
            except ReplyInterrupted as stopped:  # back to the prompt, in the same session
                session = stopped.session_id or session
    if failure is not None:
        errors.print(f"[bold red]error:[/bold red] {escape(failure)}")
    if session:
        console.print(f"session: {session}", style="dim", markup=False)
    if failure is not None:
        raise typer.Exit(1)


def _check_url(url: str) -> None:
    """Refuse a server URL carrying credentials (``user:password@``): the server takes an API
    key only, and the HTTP client would send them instead of it. The URL is not shown: it
    holds a password."""
    authority = url.partition("://")[2] if "://" in url else url
    if "@" in re.split(r"[/?#]", authority, maxsplit=1)[0]:
        _fail(
            f"--url (or {URL_ENV}) holds credentials (user:password@ before the host): the "
            "server takes only an API key, given with --key; remove them from the URL",
            code=2,
        )
    if re.search(r"[?#]", authority):
        # Not shown either: a query may hold a token.
        _fail(
            f"--url (or {URL_ENV}) holds a query or a fragment (?... or #...): it is the "
            "server's base URL, which the routes' paths are added to; remove them from it",
            code=2,
        )


def _require_key(key: str | None) -> str:
    if not key:
        _fail(f"no API key: pass --key or set {KEY_ENV}")
    if not (key.isascii() and key.isprintable()) or any(c.isspace() for c in key):
        # The key itself is not shown: it may be a real one with a stray character.
        _fail(
            "the API key holds characters no key has (a space, a line break or a non-ASCII "
            "character): give the whole key as printed, ask_<id>_<secret>, and nothing else"
        )
    return key


def _check_text(**values: str | None) -> None:
    """Refuse a value that is not text (a terminal in another encoding gives such bytes)."""
    for name, value in values.items():
        try:
            (value or "").encode("utf-8")
        except UnicodeEncodeError:
            raise CommandError(
                f"the {name} is not valid UTF-8 text (is the terminal set to another encoding?)"
            ) from None


# The statuses a run's last response event has.
ENDED = frozenset({"completed", "failed", "canceled", "rejected", "incomplete"})
# How long a reply may send nothing: a server sends a ping comment every 15 s (by default)
# while its agent is silent, so a minute of silence is a server that stopped answering.
SILENCE_SECONDS = 60.0


def _talk_client(url: str) -> httpx.Client:
    """A client of the server at ``url``, which reads it within the bounds
    ``HTTPAgentAPIClient`` reads an agent API within: a compressed answer is unpacked a
    bounded piece at a time, and a reply that sends nothing for :data:`SILENCE_SECONDS` ends."""
    import httpx

    from agentscope_serverless.helpers.agent_api_client import sync_unpacking

    timeout = httpx.Timeout(30.0, read=SILENCE_SECONDS)
    return httpx.Client(base_url=url, timeout=timeout, event_hooks=sync_unpacking())


def _stream_reply(
    client: httpx.Client, key: str, text: str, session_id: str | None, user_id: str | None
) -> str:
    """Stream one reply to the console; return the session id.

    Ctrl-C stops the reply: its run is cancelled (it would otherwise go on on the server, as
    runs do when their client leaves) and :class:`ReplyInterrupted` is raised.
    """
    import httpx

    from agentscope_serverless.helpers import agent_api_client as api
    from agentscope_serverless.helpers.sse_lines import SSELineTooLong, iter_sse_lines

    body: dict[str, Any] = {"input": [{"role": "user", "content": text}], "stream": True}
    if session_id:
        body["session_id"] = session_id
    if user_id:
        body["user_id"] = user_id  # in the body: a header carries ASCII text only
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with client.stream("POST", "/process", json=body, headers=headers) as response:
            if response.status_code in (404, 405, 501):
                # A URL with a route in it (/process, the SDKs' /compatible-mode/v1), of
                # another function of a stack (its sessions function's), or of a server
                # that takes no POST there (a static file server: 501, a website: 405).
                raise CannotTalk(
                    f"{client.base_url} serves no /process: --url is the base URL of the "
                    "server (or of a stack's process function, its ProcessUrl), such as "
                    "http://127.0.0.1:8090, without a route"
                )
            if response.status_code != 200:
                answer = api.read_error_body(response, SILENCE_SECONDS)
                if answer is None:
                    raise CommandError(
                        f"{client.base_url} answered HTTP {response.status_code}, and its error "
                        f"body did not all arrive within {SILENCE_SECONDS:g} s"
                    )
                error = api.error_of_body(answer)
                hint = _refusal_hint(error, key, user_id)
                refused = CannotTalk if hint or response.status_code in (401, 403) else CommandError
                raise refused(_error_message(response.status_code, error) + hint)
            kind = response.headers.get("content-type", "").partition(";")[0].strip()
            if kind != "text/event-stream":  # a page of a website, a proxy's catch-all
                raise CannotTalk(
                    f"{client.base_url} answered /process with {kind or 'no content type'}, "
                    "not an event stream: is --url this project's server (its base URL)?"
                )
            session_id = response.headers.get("X-Session-Id") or session_id
            # A thinking model's reasoning is printed dim, the answer on a line of its own.
            reasoning: set[str] = set()
            printed: str | None = None  # the message whose text was printed last
            ended = False
            try:
                for line in iter_sse_lines(response, api.MAX_LINE_CHARS):
                    if not line.startswith("data: "):
                        continue
                    event = _event_of(line[6:])
                    if "object" not in event and isinstance(event.get("error"), dict):
                        # The stream cut by the server (a buffered Lambda function's size
                        # limit), saying why.
                        console.print()
                        error = event["error"]
                        message = f"{error.get('message')} ({error.get('code')})"
                        raise ReplyFailed(message, session_id)
                    if event.get("object") == "message" and event.get("type") == "reasoning":
                        reasoning.add(str(event.get("id")))
                    elif event.get("object") == "message" and event.get("type") in TOOL_CALLS:
                        called = _tool_call_line(event)
                        if called is not None:
                            if printed is not None:
                                console.print()
                            console.print(called, markup=False, style="dim")
                            printed = None
                    elif event.get("object") == "content" and event.get("delta"):
                        msg_id = event.get("msg_id")
                        if printed is not None and msg_id != printed:
                            console.print()  # each message on a line of its own
                        printed = msg_id
                        style = "dim" if msg_id in reasoning else None
                        console.print(event.get("text") or "", end="", markup=False, style=style)
                        console.file.flush()
                    elif event.get("object") == "response":
                        session_id = event.get("session_id") or session_id
                        ended = event.get("status") in ENDED
                        if event.get("status") == "failed":
                            console.print()
                            error = event.get("error") or {}
                            raise ReplyFailed(
                                f"the agent failed: {error.get('message')} ({error.get('code')})",
                                session_id,
                            )
            except KeyboardInterrupt:
                _cancel_run(client, headers, response.headers.get("X-Run-Id"))
                raise ReplyInterrupted(session_id or "") from None
            except SSELineTooLong as exc:
                console.print()
                raise CannotTalk(
                    f"the server sent an event line longer than {exc.max_line_length:,} "
                    "characters, the most read of one event: the rest of the reply is not read"
                ) from None
            if not ended:
                console.print()
                run = response.headers.get("X-Run-Id")
                where = f" (read the rest with GET /runs/{run}/events)" if run else ""
                raise ReplyFailed(f"the reply was cut off before it ended{where}", session_id)
    except httpx.UnsupportedProtocol:
        raise CannotTalk(
            f"{client.base_url} is not a URL to talk to: it must start with http:// or https://"
        ) from None
    except httpx.ConnectError as exc:
        raise CannotTalk(
            f"cannot connect to {client.base_url} ({exc}): check the URL and that the server "
            "is running"
        ) from None
    except httpx.ReadTimeout:
        raise CommandError(
            f"{client.base_url} sent nothing for {SILENCE_SECONDS:g} s: it is not answering "
            "(a server starting again after an error, or not this project's server?)"
        ) from None
    except httpx.HTTPError as exc:
        raise CommandError(f"cannot talk to {client.base_url}: {type(exc).__name__}") from None
    console.print()
    return session_id or ""


# The messages of an agent calling a tool (its own function, a plugin, an MCP server's).
TOOL_CALLS = ("function_call", "plugin_call", "mcp_call")


def _tool_call_line(event: dict[str, Any]) -> str | None:
    """``[calls <name>]`` for a tool call message once completed (None before, or without a
    name)."""
    if event.get("status") != "completed":
        return None
    for part in event.get("content") or []:
        data = part.get("data") if isinstance(part, dict) else None
        if isinstance(data, dict) and isinstance(data.get("name"), str) and data["name"]:
            return f"[calls {data['name'][:200]}]"
    return None


def _cancel_run(client: httpx.Client, headers: dict[str, str], run_id: str | None) -> None:
    """Ask the server to stop the run ``run_id``, saying so (a second Ctrl-C leaves at once)."""
    import httpx

    console.print()
    if not run_id:
        return
    status = None
    try:  # the status says it all: the body is not read (a server's may never end)
        with client.stream(
            "POST", f"/runs/{quote(run_id, safe='')}/cancel", headers=headers
        ) as answer:
            status = answer.status_code
    except httpx.HTTPError:
        pass
    if status in (202, 409):
        console.print("stopped: the run was cancelled", style="dim", markup=False)
    else:
        console.print("stopped showing the reply; the run may go on", style="dim", markup=False)


def _event_of(data: str) -> dict[str, Any]:
    """The event of a ``data:`` line; a line that is not a JSON object is no server's of
    this project."""
    try:
        event = json.loads(data)
    except (ValueError, RecursionError):
        event = None
    if not isinstance(event, dict):
        console.print()
        raise CannotTalk(
            "the server sent an event that is not a JSON object (is --url this project's server?)"
        )
    return event


def _refusal_hint(error: dict[str, Any] | None, key: str, user_id: str | None) -> str:
    """What to change in the command for a request refused for its key or its user (its
    body's ``error``), in the command's terms (the server's message speaks of HTTP headers
    and fields); else ``""``."""
    from agentscope_serverless.auth.keys import parse_key
    from agentscope_serverless.http.auth import USER_HEADER

    if error is None or "code" not in error:
        return ""
    code, param = error["code"], error.get("param")
    if code == "UNAUTHENTICATED" and parse_key(key) is not None:
        # A key of the right form that the server does not know.
        return (
            " (this server knows no such key: a wrong key, one revoked, or a development key "
            "printed by serve, which lasts as long as that server: after a restart, use the "
            "key it printed then)"
        )
    if code == "PERMISSION_DENIED" and user_id:
        return " (a user key acts only as its own user: leave out --user)"
    if code == "INVALID_INPUT" and param == USER_HEADER and not user_id:
        return " (a service key acts for a user it names: pass --user <user>)"
    return ""


def _error_message(status: int, error: dict[str, Any] | None) -> str:
    if error is None or "code" not in error or "message" not in error:
        return f"HTTP {status}"
    return f"HTTP {status} {error['code']}: {error['message']}"


def _key_store(file: Path | None, table: str | None) -> tuple[KeyStore, str]:
    """The key store the ``keys`` commands work on, and where it is (for messages).

    ``--file`` or ``--table`` when given; otherwise the dynamodb store when
    ``AUTH_KEYS_BACKEND=dynamodb``, else the key file (an in-memory store would be pointless).
    """
    from agentscope_serverless.auth.factory import create_key_store
    from agentscope_serverless.auth.file import FileKeyStore
    from agentscope_serverless.settings import load_settings

    if file is not None and table is not None:
        _fail("give --file or --table, not both", code=2)
    if file is not None:
        chosen = FileKeyStore(file)
        return chosen, str(chosen.path)
    try:
        settings = load_settings()
        if table is not None:
            settings = load_settings(auth_keys_backend="dynamodb", auth_keys_table=table)
    except AgentScopeServerlessError as exc:
        _fail(exc.message, code=2)
    if settings.auth_keys_backend == "dynamodb":
        return create_key_store(settings), f"the DynamoDB table {settings.auth_keys_table}"
    default = FileKeyStore(settings.auth_keys_file)
    return default, str(default.path)


_Result = TypeVar("_Result")


def _on_store(work: Coroutine[Any, Any, _Result]) -> _Result:
    """Run ``work`` of a ``keys`` command on its store, what the store logs (a key file it
    cannot read, naming it) going to stderr with the errors: the command's output is its
    own (``keys list | cut -f1``)."""
    with contextlib.redirect_stdout(sys.stderr):
        return asyncio.run(work)


@keys_app.command("create")
def keys_create(
    user: Annotated[
        str | None, typer.Option("--user", help="A user key: the user it acts as.")
    ] = None,
    service: Annotated[
        bool, typer.Option("--service", help="A service key: acts for the user each request names.")
    ] = False,
    file: FileOption = None,
    table: TableOption = None,
) -> None:
    """Create a key and print it (once: only its hash is stored)."""
    if service and user is not None:
        _fail("a service key acts for any user: leave out --user")
    if not service and user is None:
        _fail("say who the key is for: --user <user>, or --service")
    if user is not None and not user.strip():
        _fail("--user is blank: give the id of the user the key acts as")
    if user is not None and user != user.strip():
        # A service key could never name such a user: servers strip a header's value.
        _fail(f"--user {user!r} begins or ends with whitespace: give the id without it")
    store, where = _key_store(file, table)

    async def create() -> Any:
        async with store:
            return await store.create_key(kind="service" if service else "user", user_id=user)

    try:
        issued = _on_store(create())
    except AgentScopeServerlessError as exc:
        _fail(exc.message)
    record = issued.record
    who = f"user {record.user_id!r}" if record.user_id else "a service"
    console.print(f"Created key [bold]{record.key_id}[/bold] {escape(f'for {who} in {where}:')}")
    console.print(issued.key, markup=False)
    console.print("[yellow]Keep it now: it is not shown again.[/yellow]")


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id (from `keys list`), or the whole key.")],
    file: FileOption = None,
    table: TableOption = None,
) -> None:
    """Revoke a key for good (a server caching keys sees it within AUTH_KEYS_CACHE_SECONDS)."""
    store, _ = _key_store(file, table)

    async def revoke() -> Any:
        async with store:
            return await store.revoke_key(key_id)

    try:
        record = _on_store(revoke())
    except AgentScopeServerlessError as exc:
        _fail(exc.message)
    console.print(f"Revoked key [bold]{record.key_id}[/bold].")


@keys_app.command("list")
def keys_list(file: FileOption = None, table: TableOption = None) -> None:
    """List the keys (ids, kinds and users; never the keys themselves)."""
    store, _ = _key_store(file, table)

    async def list_keys() -> Any:
        async with store:
            return await store.list_keys()

    try:
        records = _on_store(list_keys())
    except AgentScopeServerlessError as exc:
        _fail(exc.message)
    rows = [
        (
            record.key_id,
            record.kind,
            record.user_id or "-",
            _created(record.created_at),
            "revoked" if record.revoked else "active",
        )
        for record in records
    ]
    if not console.is_terminal:
        # To a pipe or a file: one tab-separated line per key, for awk and cut.
        # A user id may hold tabs and line breaks: written as \t and \n.
        for row in rows:
            print("\t".join(_tsv_field(field) for field in row))
        return
    listing = Table("key id", "kind", "user", "created", "status")
    for key_id, kind, user, created, status in rows:
        colour = "red" if status == "revoked" else "green"
        shown = escape(_bidi_escaped(user))
        listing.add_row(key_id, kind, shown, created, f"[{colour}]{status}[/{colour}]")
    console.print(listing)


def _created(timestamp: int) -> str:
    """When a key was created, to the minute; a time no date has (a hand edit of the key
    file or table, which a server never reads) as it is."""
    try:
        return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%MZ")
    except (OverflowError, OSError, ValueError):
        return str(timestamp)


def _bidi_escaped(text: str) -> str:
    """``text`` with its bidirectional controls as escapes (``\\u202e``): a user id of a hand
    edit of the key file or table may hold them, to show as another user's id."""
    from agentscope_serverless.services._validation import BIDI_CONTROLS

    return text.translate({ord(control): f"\\u{ord(control):04x}" for control in BIDI_CONTROLS})


def _tsv_field(text: str) -> str:
    """``text`` as a field of a tab-separated line: backslashes, tabs and line breaks as
    escapes, and the other control characters too, as the terminal's table shows them."""
    escaped = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    return _bidi_escaped(escaped.replace("\r", "\\r").translate(_CONTROLS))


def main() -> None:
    """Entry point of the console script."""
    app()


__all__ = ["app", "main"]


if __name__ == "__main__":  # python -m agentscope_serverless.cli (the archives' entry command)
    main()
