"""What every package of a user's project holds, whatever the target (SAM, AgentRun, ModelStudio).

- the **project's code**: the source folder (the working directory, or ``--source``) without
  ``.git``, virtualenvs, caches and build outputs;
- the **runtime**: this package without its tools (CLI, deploy, packaging, local stack),
  and its dependencies pinned by ``runtime.lock``, shipped inside the package;
- the project's ``requirements.txt``, resolved for the target platform and Python together
  with the runtime's pins (``runtime.lock`` as constraints).

Before an archive is written, :func:`check_agent_import` imports ``--agent`` from the
archive's contents alone with the target's Python, and refuses when it cannot.
"""

from __future__ import annotations

import codecs
import csv
import functools
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agentscope_serverless.errors import PackagingError
from agentscope_serverless.log import (
    redact,
    redact_aws_credentials,
    redacted,
    without_url_credentials,
)
from agentscope_serverless.serve import source_root
from agentscope_serverless.settings import environment_secrets

PACKAGE = "agentscope_serverless"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
RUNTIME_LOCK = PACKAGE_DIR / "runtime.lock"

# Tools, never needed by a served agent: left out of every package.
TOOL_MODULES = (
    "cli.py",
    "deploy_cli.py",
    "local_stack.py",
    "reloader.py",
    "packaging",
    "sam_project",
)
# Lambda cannot host sandboxes (the sandbox function talks to a remote server).
LAMBDA_EXCLUDED = (*TOOL_MODULES, "sandbox_server")

# Secrets, left out wherever they are (and named by the build: :func:`secrets_left_out`): a
# deployed agent gets its settings from the platform (``--env``, the secret), not from a file,
# and an archive's files are readable by any user.
SECRET_EXCLUDES = (
    # Of local runs: dotenv's .env, .env.local, .env.production, ..., Compose's app.env,
    # direnv's .envrc.
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    # The developer's own credentials, as their tools keep them in a home folder (a project
    # run from there, or with a copy of them).
    ".aws",
    ".azure",
    ".ssh",
    ".gnupg",
    ".kube",
    ".netrc",
    "_netrc",
    ".npmrc",
    ".pypirc",
    ".pgpass",
    ".git-credentials",
    ".dockercfg",
    # Key stores holding a private key (as PKCS #12).
    "*.p12",
    "*.pfx",
)
# Secrets named so in their tool's folder alone: Docker's logins, Streamlit's secrets.
SECRET_FILES = (".docker/config.json", ".streamlit/secrets.toml")
# How a private key is written: a PEM one's first line (OpenSSH's id_rsa, a TLS key.pem...),
# a PuTTY key file's (server.ppk), a kubeconfig's client key (``client-key-data:``, a PEM
# key in base64). A file holding one is left out, whatever its name; a certificate (a CA
# bundle the agent trusts, a kubeconfig's ``certificate-authority-data``) is copied.
_PRIVATE_KEY = re.compile(
    rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"
    rb"|^PuTTY-User-Key-File-\d+:"
    rb"|^[ \t]*client-key-data:[ \t]*[\"']?[A-Za-z0-9+/]{20,}"
    rb'|"client-key-data"[ \t]*:[ \t]*"[A-Za-z0-9+/]{20,}',  # as JSON
    re.MULTILINE,
)
# Credentials in a data file of any name (prod-aws.ini, creds.cfg, secrets/aws, an OAuth
# client's or a service account's JSON, a copy of Docker's logins): an AWS shared-credentials
# (or dotenv) line assigning a secret key, or a JSON secret key, of a long value (not a
# placeholder, ``${SECRET}``), or Docker's ``"auths"`` holding an ``"auth"`` (user:password in
# base64).
_CREDENTIALS = re.compile(
    rb"^[ \t]*(?:export[ \t]+)?aws_secret_access_key[ \t]*=[ \t]*[\"']?[A-Za-z0-9/+=]{20,}"
    rb'|"(?:client_secret|private_key|aws_secret_access_key)"[ \t]*:[ \t]*"[\w/+=.:-]{16,}"'
    rb'|"auths"\s*:\s*\{[^\0]*?"auth"\s*:\s*"[A-Za-z0-9+/]{8,}={0,2}"',
    re.IGNORECASE | re.MULTILINE,
)
# An API key or token in a form its issuer gives it (OpenAI's and Anthropic's sk-..., GitHub's
# ghp_... and github_pat_..., Slack's xoxb-..., an AWS access key's AKIA..., Google's AIza...,
# Hugging Face's hf_..., Stripe's sk_live_...): a file holding one is left out, whatever its name.
_KEY_FORMS = re.compile(
    rb"(?<![\w-])(?:sk-(?=[\w-]*\d)[\w-]{20,}"
    rb"|gh[pousr]_[A-Za-z0-9]{30,}"
    rb"|github_pat_\w{22,}"
    rb"|xox[abposr]-(?=[\w-]*\d)[\w-]{10,}"
    rb"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    rb"|AIza[\w-]{35}"
    rb"|hf_[A-Za-z0-9]{30,}"
    rb"|[rs]k_live_[A-Za-z0-9]{20,})(?![\w-])"
)
# What names a secret, as a setting's name, after a dotted path or not
# (spring.datasource.password): upper-snake (OPENAI_API_KEY, GITHUB_TOKEN, CLIENT_SECRET,
# DB_PASSWORD), lower snake or kebab case (db_password, smtp-password, client_secret,
# api-key), camel or Pascal case (dbPassword, clientSecret, apiKey, AwsSecretKey), and a
# few tokens by their kind (token, access_token, refreshToken); never a name only ending so
# (nextPageToken, unk_token, max_tokens, openai_secret_id).
_SECRET_NAME = (
    rb"(?:[A-Za-z][\w-]*\.)*(?:"
    rb"(?:[A-Z][A-Z0-9]*_)*(?:API_KEY|ACCESS_KEY|SECRET_KEY|PRIVATE_KEY|TOKEN|SECRET|PASSWD"
    rb"|PASSWORD)"
    rb"|(?:[a-z][a-z0-9]*[_-])*(?:api|access|secret|private)[_-]key"
    rb"|(?:[a-z][a-z0-9]*[_-])*(?:secret|password|passwd)"
    rb"|(?:(?:access|refresh|auth|api|bearer)[_-])?token"
    rb"|(?:api|access|secret|private)Key|(?:access|refresh|auth|api|bearer)Token"
    rb"|(?:[A-Za-z][a-z0-9]*(?:[A-Z][a-z0-9]*)*)?"
    rb"(?:(?:Api|Access|Secret|Private)Key|(?:Access|Refresh|Auth|Api|Bearer)Token"
    rb"|Secret|Password|Passwd)"
    rb")"
)
# A key-like value: 16 printable characters or more, a digit among them, ending there (at
# its closing quote, when quoted: the quotes are not part of it; else at a space, before a
# comment): a password's punctuation (``Xk9#mP2$vL8@qR5!zT``) is in, but not a ``/`` (a path,
# a URL, a secret's name in a store, ``os.environ/NAME``), a space (text), a quote
# (``os.environ["NAME"]``), nor a reference's start (``${NAME}``, ``$NAME``, ``%(name)s``,
# ``{{ name }}``, ``<password>``, a secret's ARN).
_SECRET_VALUE = (
    rb"(?P<quote>[\"'])?(?![$%{<]|arn:)"
    rb"(?P<value>(?=[^\x00-\x20\x7f/\"']*\d)[^\x00-\x20\x7f/\"']{16,})"
    rb"(?(quote)(?P=quote)|(?!\S))"
)
# A data file (a config, a JSON, a dotenv file of any name) assigning one such name a literal
# value: ``OPENAI_API_KEY=...``, ``"api_key": "..."``, ``token: ...``.
_ASSIGNED_SECRET = re.compile(
    rb"(?<![\w.-])[\"']?(?:" + _SECRET_NAME + rb")[\"']?[ \t]*[:=][ \t]*" + _SECRET_VALUE
)
# A URL carrying its password (``postgresql://app:s3cr3t-2024@db.internal/app``,
# ``redis://:pa55word@cache:6379``, ``amqp://bot:hunter22@mq``), as a config names its database:
# a literal of 8 characters or more (not a reference, ``${DB_PASSWORD}``, ``$PASSWORD``,
# ``%(password)s``, ``{password}``, ``<password>``, nor a placeholder), of a host other than
# this machine's (``postgres:postgres@localhost`` is a local database's default).
_URL_PASSWORD = re.compile(
    rb"(?<![\w+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@\"'<>]*:"
    rb"(?P<value>(?![$%{<])[^\s:/?#@\"'<>\\]{8,})@(?!localhost\b|127\.|\[::1\])[\w.\[\]-]"
)
# A value written in place of a key, not one: AWS's documented AKIAIOSFODNN7EXAMPLE, a test's
# sk-test-0000000000000000, sk-proj-XXXXXXXXXXXXXXXXXXXX1234, your-api-key, a fake or dummy.
_PLACEHOLDER = re.compile(
    rb"example|test|fake|dummy|placeholder|your|changeme|^password$|(.)\1{5}", re.IGNORECASE
)
# A line marked so (detect-secrets' convention) holds no secret, whatever it looks like.
_ALLOWLIST_MARK = b"pragma: allowlist secret"
# Code, and prose, which may name those keys (a module reading such a file, a README showing
# its format): never left out for the credentials lines above, only for a key of a form above.
_SOURCE_SUFFIXES = frozenset(
    {".py", ".pyi", ".pyx", ".ipynb", ".sh", ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx"}
    | {".go", ".rs", ".java", ".rb", ".md", ".rst"}
)
# The project's modules: never left out (the agent would break without them); one holding a
# secret fails the build (:func:`_refuse_secrets_in_code`).
_MODULE_SUFFIXES_OF_CODE = frozenset({".py"})

PROJECT_EXCLUDES = (
    ".git",
    ".hg",
    ".venv",
    "venv",
    ".venv-*",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".aws-sam",
    "dist",
    "build",
    # Archives of earlier builds (an --out folder another build does not know of), and the
    # folders builds running at once assemble theirs in.
    "*-agentrun.zip",
    "*-modelstudio.zip",
    ".agentscope-build-*",
    "*.egg-info",
    ".DS_Store",
    # Test modules, wherever they are (beside the code they test): no function runs them.
    "test_*.py",
    "*_test.py",
    *SECRET_EXCLUDES,
)
# How the folder a build assembles its archive in begins (in the output folder).
SCRATCH_PREFIX = ".agentscope-build-"
# The project's tests and their settings (as ``init`` lays them out, and tox's, nox's and
# coverage's), left out at its top: no function runs them.
PROJECT_TOP_EXCLUDES = (
    "tests",
    "conftest.py",
    "pytest.ini",
    "tox.ini",
    "noxfile.py",
    ".coveragerc",
)


def runtime_lock() -> Path:
    """The runtime's pinned requirements, shipped inside the package."""
    if not RUNTIME_LOCK.is_file():
        raise PackagingError(
            f"{RUNTIME_LOCK} is missing: this installation of {PACKAGE} cannot package projects"
        )
    return RUNTIME_LOCK


def copy_runtime(target: Path, *, excluded: Sequence[str] = TOOL_MODULES) -> None:
    """Copy this package's runtime (not its tools) to ``target/agentscope_serverless``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    destination = target / PACKAGE
    destination.mkdir(parents=True, exist_ok=True)
    for entry in PACKAGE_DIR.iterdir():
        if entry.name in excluded or entry.name == "__pycache__":
            continue
        if entry.is_dir():
            shutil.copytree(entry, destination / entry.name, ignore=ignore)
        elif entry.suffix in (".py", ".lock", ".typed"):
            shutil.copy2(entry, destination / entry.name)


def is_this_repository(source: Path) -> bool:
    """Whether ``source`` is this project's own checkout (it has no user code to package)."""
    return (source / "shared" / PACKAGE / "__init__.py").is_file()


def copy_project(
    source: Path, target: Path, *, leave_out: Sequence[Path] = (), installed: Path | None = None
) -> list[str]:
    """Copy the project's code to ``target``; returns the top-level names copied.

    A project in the src layout (:func:`~agentscope_serverless.serve.source_root`) has the
    contents of its ``src/`` folder copied to the top, in place of the folder, as pip
    installs its packages. ``target`` and the paths of ``leave_out`` that are inside the
    project (a build's output folder, say) are not copied: a build writing into the project
    would otherwise copy what it writes into itself, without end. With ``installed``, the
    folder the dependencies were installed in, names of theirs are refused before anything
    is copied (:func:`refuse_shadowing`).
    """
    if is_this_repository(source):
        return []
    ignore = _project_ignore(source, [target, *leave_out])
    entries = _project_entries(source, ignore)
    if installed is not None:
        refuse_shadowing([entry.name for entry in entries], installed)
    for entry in entries:
        if entry.is_dir():
            shutil.copytree(
                entry,
                target / entry.name,
                ignore=ignore,
                dirs_exist_ok=True,
                copy_function=_copy_anew,
            )
        else:
            _copy_anew(entry, target / entry.name)
    return [entry.name for entry in entries]


def check_archivable(source: Path, *, leave_out: Sequence[Path] = ()) -> list[str]:
    """Refuse a project an archive cannot hold, before anything is resolved or installed:
    what :func:`copy_project` refuses, and a file whose name is not UTF-8 (a zip archive
    names its files in UTF-8). Returns the top-level names the copy takes.

    >>> check_archivable(Path("my-agent"), leave_out=[Path("my-agent/dist")])  # doctest: +SKIP
    ['agent.py', 'requirements.txt']
    """
    if is_this_repository(source):
        return []
    ignore = _project_ignore(source, leave_out)
    entries = _project_entries(source, ignore)
    for path in _archived_paths(entries, ignore):
        _refuse_unencodable_name(path.relative_to(source))
    return [entry.name for entry in entries]


def project_files(source: Path, *, leave_out: Sequence[Path] = ()) -> list[Path]:
    """The files :func:`copy_project` takes from ``source`` (after :func:`check_archivable`),
    as paths in it."""
    if is_this_repository(source):
        return []
    ignore = _project_ignore(source, leave_out)
    paths = _archived_paths(_project_entries(source, ignore), ignore)
    return [path for path in paths if path.is_file()]


def _archived_paths(
    entries: Sequence[Path], ignore: Callable[[str, list[str]], set[str]]
) -> list[Path]:
    """``entries`` and every path below them that ``ignore`` does not leave out."""
    paths = []
    for entry in entries:
        paths.append(entry)
        for folder, folders, files in os.walk(entry, followlinks=True):
            skipped = ignore(folder, [*folders, *files])
            folders[:] = [name for name in folders if name not in skipped]
            paths += [Path(folder, name) for name in [*folders, *files] if name not in skipped]
    return paths


def _refuse_unencodable_name(path: Path) -> None:
    try:
        path.as_posix().encode()
    except UnicodeEncodeError:  # bytes of another encoding (Latin-1...), as Python read them
        shown = os.fsencode(path.as_posix()).decode(errors="backslashreplace")
        raise PackagingError(
            f"the name of {shown} is not UTF-8 (written on another system, say), which an "
            "archive cannot hold: rename it"
        ) from None


def _project_entries(source: Path, ignore: Callable[[str, list[str]], set[str]]) -> list[Path]:
    """The project's entries the copy puts at the top of its target (the contents of
    ``src/`` in the src layout), once no link of the project leads out of it."""
    if not source.is_dir():
        raise PackagingError(f"the project folder {source} does not exist")
    _refuse_links_out(source, ignore)
    _refuse_secrets_in_code(source, ignore)
    entries = _top_entries(source, ignore)
    src = source_root(source)
    if src is not None and src in entries:
        entries.remove(src)
        packages = _top_entries(src, ignore)
        clashes = sorted({p.name for p in entries} & {p.name for p in packages})
        if clashes:
            raise PackagingError(
                f"the project is in the src layout, and {', '.join(clashes)} "
                f"{'is' if len(clashes) == 1 else 'are'} both in src/ and at its root: "
                "packaged, what src/ holds goes to the top, where the other is; rename one"
            )
        entries += packages
    _refuse_hiding_names(entries)
    return entries


def _top_entries(folder: Path, ignore: Callable[[str, list[str]], set[str]]) -> list[Path]:
    """The entries of ``folder`` the copy takes (not those ``ignore`` leaves out)."""
    skip = set(ignore(str(folder), [p.name for p in folder.iterdir()]))
    return [p for p in sorted(folder.iterdir()) if p.name not in skip]


def standard_module(name: str) -> bool:
    """Whether ``name`` is a top-level module of Python's standard library (``secrets``,
    ``uuid``, ``json``...): a module of a project by that name hides it, or is hidden."""
    return name in sys.stdlib_module_names


# The modules the runtime's start imports: the server of an archive (``python3 -m
# agentscope_serverless.serve``) and a Lambda function's handler.
_STARTUP_MODULES = (
    f"{PACKAGE}.serve",
    f"{PACKAGE}.aws_secrets",
    f"{PACKAGE}.settings",
    f"{PACKAGE}.auth.factory",
    f"{PACKAGE}.app",
    f"{PACKAGE}.http.app",
    f"{PACKAGE}.http.errors",
    f"{PACKAGE}.http.middleware",
    f"{PACKAGE}.http.lambda_handler",
    "uvicorn.main",
)
_STARTUP_PROBE = """
import sys
before = set(sys.modules)  # imported as Python starts, before the project is on the path
import importlib, json
sys.path.insert(0, sys.argv[1])
for name in json.loads(sys.argv[2]):
    importlib.import_module(name)
print(json.dumps(sorted({n.partition(".")[0] for n in set(sys.modules) - before})))
"""


@functools.cache
def started_standard_modules() -> frozenset[str]:
    """The standard library's top-level modules the runtime imports as it starts (``secrets``,
    ``uuid``, ``json``, ``email``...; not ``chunk`` or ``statistics``), found once by importing
    its server and handler in a fresh interpreter: only those can a project's module of the
    same name hide. Should that import fail, every module of the standard library."""
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-B",
            "-c",
            _STARTUP_PROBE,
            str(PACKAGE_DIR.parent),
            json.dumps(_STARTUP_MODULES),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    try:
        imported = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return frozenset(sys.stdlib_module_names)
    return frozenset(imported) & sys.stdlib_module_names


def _refuse_hiding_names(entries: Sequence[Path]) -> None:
    """Refuse the project's top-level modules and packages named as a module of the standard
    library the runtime imports as it starts (``secrets.py``, ``uuid.py``, ``json/``:
    :func:`started_standard_modules`; ``chunk.py`` is copied), or as this package: a package
    puts the project ahead of the standard library on the import path (Lambda's task folder and
    layer, an archive's root), so ``secrets.py`` is what ``from secrets import token_hex``
    gets, and the deployed app cannot start; ``agentscope_serverless/`` goes into the
    runtime's package (or is not copied), ``agentscope_serverless.py`` is hidden by it. A
    folder without ``__init__.py`` (``html/`` of static files) hides no module."""
    standard: dict[str, str] = {}  # each entry shown: the module it hides
    own = []
    for entry in entries:
        folder = entry.is_dir()
        shown = f"{entry.name}/" if folder else entry.name
        module = _top_module(entry.name, folder=folder)
        if module == PACKAGE:
            own.append(shown)
        elif module in started_standard_modules() and _hides(entry):
            standard[shown] = module
    if own:
        raise PackagingError(
            f"the project's {', '.join(own)} {'is' if len(own) == 1 else 'are'} named as the "
            "runtime's own package, which every package of the project holds: one would hide "
            "or overwrite the other; rename the project's"
        )
    if standard:
        one = len(standard) == 1
        raise PackagingError(
            f"the project's {', '.join(standard)} {'hides' if one else 'hide'} the standard "
            f"library's module{'' if one else 's'} {', '.join(standard.values())}: deployed, "
            "the project comes ahead of the standard library on the import path, so every "
            f"import of {'it' if one else 'them'} (starlette's from secrets import token_hex, "
            "say) would get the project's, and the app could not start; rename the project's"
        )


def _hides(entry: Path) -> bool:
    """Whether ``entry``, at the top of the import path, is imported ahead of the standard
    library's module of its name: a module, or a package (``__init__.py``); a folder without
    one (a namespace) comes after it."""
    return not entry.is_dir() or (entry / "__init__.py").is_file()


def _refuse_secrets_in_code(source: Path, ignore: Callable[[str, list[str]], set[str]]) -> None:
    """Refuse a module of the project (a ``.py`` file the copy takes) holding a secret: a key
    of a known form (:data:`_KEY_FORMS`) or a PEM private key, not a placeholder
    (``AKIAIOSFODNN7EXAMPLE``, ``sk-test-0000...``) nor on a line marked
    ``# pragma: allowlist secret``. Left out, the agent could not import it;
    copied, any reader of the archive has the secret. The error names the file and the line,
    never the value."""
    found = []
    for folder, folders, files in os.walk(source, followlinks=True):
        skipped = ignore(folder, [*folders, *files])
        folders[:] = sorted(name for name in folders if name not in skipped)
        for name in sorted(files):
            path = Path(folder, name)
            if name in skipped or path.suffix.lower() not in _MODULE_SUFFIXES_OF_CODE:
                continue
            try:
                text = path.read_bytes()
            except OSError:  # unreadable here: the copy says so
                continue
            at = _secret_at(text, (_KEY_FORMS, _PRIVATE_KEY))
            if at is not None:
                line = text.count(b"\n", 0, at) + 1
                found.append(f"{path.relative_to(source).as_posix()} (line {line})")
    if found:
        raise PackagingError(
            f"{', '.join(found)} {'holds' if len(found) == 1 else 'hold'} what looks like a "
            "secret (an API key or a token in its issuer's form, or a private key, written "
            "in the code): the package would carry it to anyone who reads it, and the agent "
            "cannot do without the module; read it from the environment (os.environ) and "
            "give it in the platform's (--env, the stack's secret) instead; a value that is "
            "no secret is let through by # pragma: allowlist secret on its line"
        )


def _secret_at(text: bytes, patterns: Sequence[re.Pattern[bytes]]) -> int | None:
    """Where ``text`` first holds a secret one of ``patterns`` finds: not a placeholder
    (:data:`_PLACEHOLDER`) for a key, nor on a line marked :data:`_ALLOWLIST_MARK`."""
    found = []
    for pattern in patterns:
        for match in pattern.finditer(text):
            start = text.rfind(b"\n", 0, match.start()) + 1
            end = text.find(b"\n", match.end())
            if _ALLOWLIST_MARK in text[start : end if end >= 0 else len(text)]:
                continue
            value = match.groupdict().get("value") or match.group()
            if pattern is not _PRIVATE_KEY and _PLACEHOLDER.search(value):
                continue
            found.append(match.start())
            break
    return min(found, default=None)


def _copy_anew(source: str | Path, destination: str | Path) -> None:
    """Copy ``source`` to a new file at ``destination``: a file there (a dependency's, which
    uv links to its cache and to every virtualenv it installed it in) is replaced, never
    written into."""
    Path(destination).unlink(missing_ok=True)
    shutil.copy2(source, destination)


def _project_ignore(source: Path, outputs: Sequence[Path]) -> Callable[[str, list[str]], set[str]]:
    """What the copy of ``source`` leaves out of each folder: the names of
    :data:`PROJECT_EXCLUDES` (and, at the top, :data:`PROJECT_TOP_EXCLUDES`), virtualenvs
    (folders holding a ``pyvenv.cfg``) and the ``outputs`` inside the project (never its
    root)."""
    patterns = shutil.ignore_patterns(*PROJECT_EXCLUDES)
    root = source.resolve()
    inside = {path.resolve() for path in outputs}
    inside = {path for path in inside if root in path.parents}

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = set(patterns(folder, names))
        here = Path(folder).resolve()
        if here == root:
            skipped.update(name for name in names if name in PROJECT_TOP_EXCLUDES)
        skipped.update(name for name in names if here / name in inside)
        skipped.update(name for name in names if name not in skipped and _is_secret(here / name))
        # A virtualenv, whatever its name (`python -m venv env`), or a conda environment
        # (`conda create -p ./env`): this machine's interpreter and packages, never the
        # target's.
        skipped.update(name for name in names if _is_environment(Path(folder, name)))
        return skipped

    return ignore


def _is_secret(path: Path) -> bool:
    """Whether ``path`` is one of :data:`SECRET_FILES`, a file holding a PEM private key or a
    key of a known form (``sk-...``, ``ghp_...``), or a file other than code holding
    credentials (``aws_secret_access_key = ...``, ``"client_secret": "..."``,
    ``OPENAI_API_KEY=...``, ``"api_key": "..."``, a URL with its password), as its first
    16 KB say (a kubeconfig's client key comes after its certificates). A module of the
    project (``.py``) is never one: holding a secret, it fails the build instead
    (:func:`_refuse_secrets_in_code`)."""
    if f"{path.parent.name}/{path.name}" in SECRET_FILES:
        return True
    suffix = path.suffix.lower()
    if suffix in _MODULE_SUFFIXES_OF_CODE or not path.is_file():
        return False  # a folder, a link to nothing (refused elsewhere), a pipe
    try:
        with path.open("rb") as file:
            head = file.read(16384)
    except OSError:  # unreadable here: the copy says so
        return False
    if _secret_at(head, (_PRIVATE_KEY, _KEY_FORMS)) is not None:
        return True
    if suffix in _SOURCE_SUFFIXES:
        return False
    return (
        _CREDENTIALS.search(head) is not None
        or _secret_at(head, (_ASSIGNED_SECRET, _URL_PASSWORD)) is not None
    )


def secrets_left_out(source: Path) -> list[str]:
    """The secrets of the project the copy leaves out (:data:`SECRET_EXCLUDES`,
    :data:`SECRET_FILES`, private keys, credentials files), as paths in it, a folder's ending
    with ``/``: a build names them, so that nothing the agent needs goes missing unsaid.

    >>> secrets_left_out(Path("my-agent"))  # doctest: +SKIP
    ['.aws/', '.env', 'keys/id_rsa']
    """
    if is_this_repository(source):
        return []
    ignore = _project_ignore(source, ())
    named = shutil.ignore_patterns(*SECRET_EXCLUDES)
    found = []
    for folder, folders, files in os.walk(source, followlinks=True):
        here, names = Path(folder), [*folders, *files]
        skipped = ignore(folder, names)
        secrets = set(named(folder, names)) | {n for n in skipped if _is_secret(here / n)}
        found += [f"{(here / n).relative_to(source).as_posix()}/" for n in folders if n in secrets]
        found += [(here / n).relative_to(source).as_posix() for n in files if n in secrets]
        folders[:] = [name for name in folders if name not in skipped]
    return sorted(found)


# An AgentApp a module assigns at its top level: ``app = AgentApp(...)``, typed or not.
_APP_ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=\s*AgentApp\(", re.MULTILINE)


def agents_of(source: Path, *, leave_out: Sequence[Path] = ()) -> list[str]:
    """The AgentApps the project's modules assign at their top level, as ``module:attribute``
    (what ``--agent`` takes), found by reading the modules the copy takes (none is imported);
    empty for this repository.

    >>> agents_of(Path("my-agent"))  # doctest: +SKIP
    ['weather.agent:app']
    """
    if is_this_repository(source):
        return []
    ignore = _project_ignore(source, leave_out)
    src = source_root(source)
    found = []
    for folder, folders, files in os.walk(source, followlinks=True):
        skipped = ignore(folder, [*folders, *files])
        folders[:] = sorted(name for name in folders if name not in skipped)
        for name in sorted(n for n in files if n.endswith(".py") and n not in skipped):
            path = Path(folder, name)
            top = src if src is not None and src in path.parents else source
            parts = path.relative_to(top).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if not parts or not all(part.isidentifier() for part in parts):
                continue
            text = path.read_text(errors="replace")
            module = ".".join(parts)
            found += [f"{module}:{attribute}" for attribute in _APP_ASSIGNMENT.findall(text)]
    return found


def holds_code(source: Path, *, leave_out: Sequence[Path] = ()) -> bool:
    """Whether the project has anything of its own to package (not this repository, nor a
    folder empty of all but what the copy leaves out)."""
    if is_this_repository(source):
        return False
    return bool(_top_entries(source, _project_ignore(source, leave_out)))


def _left_out(path: Path, root: Path, ignore: Callable[[str, list[str]], set[str]]) -> bool:
    """Whether the copy of ``root`` leaves out ``path`` (inside it), or a folder holding it."""
    folder = root
    for part in path.relative_to(root).parts:
        if part in ignore(str(folder), [part]):
            return True
        folder = folder / part
    return False


def _is_environment(folder: Path) -> bool:
    """Whether ``folder`` is a Python environment: a virtualenv's (its ``pyvenv.cfg``) or a
    conda environment's (its ``conda-meta``)."""
    return (folder / "pyvenv.cfg").is_file() or (folder / "conda-meta").is_dir()


def _refuse_links_out(source: Path, ignore: Callable[[str, list[str]], set[str]]) -> None:
    """Refuse a symbolic link of the project (outside what is left out) to anything outside
    it, or into a folder the copy is already in: the copy follows links, so it would put
    what they point to (a key in the home folder, say) in an archive, or never end."""
    root = source.resolve()
    top = Path(os.path.abspath(source))
    real_of: dict[str, Path] = {}  # each folder walked (as the copy sees it): its real path
    for folder, folders, files in os.walk(top, followlinks=True):
        real = Path(folder).resolve()
        if real in {real_of.get(str(up)) for up in Path(folder).parents}:
            raise PackagingError(
                f"{Path(folder).relative_to(top)} links back to a folder holding it: "
                "packaging would copy it without end"
            )
        real_of[folder] = real
        skipped = ignore(folder, [*folders, *files])
        folders[:] = [name for name in folders if name not in skipped]
        for name in [*folders, *files]:
            path = Path(folder, name)
            if name in skipped or not path.is_symlink():
                continue
            try:
                target = path.resolve(strict=True)
            except FileNotFoundError:
                raise PackagingError(
                    f"{path.relative_to(top)} links to {os.readlink(path)}, which does not "
                    "exist: remove the link, or put what it names there"
                ) from None
            except (OSError, RuntimeError):  # links leading to one another (ELOOP)
                raise PackagingError(
                    f"{path.relative_to(top)} is a link that leads back to itself through "
                    "links, to no file: remove it"
                ) from None
            if target != root and root not in target.parents:
                raise PackagingError(
                    f"{path.relative_to(top)} links outside the project folder: packaging "
                    "would copy what it points to into the archive; copy the file in instead"
                )
            if _left_out(target, root, ignore):
                raise PackagingError(
                    f"{path.relative_to(top)} links to {target.relative_to(root)}, which "
                    "packaging leaves out (a secret's .env, a virtualenv...): the copy would "
                    "put it in the archive under the link's name; remove the link, or copy in "
                    "what the agent needs"
                )


# Files a folder on the import path offers as modules (``six.py``, an extension module
# ``_speedups.cpython-312-x86_64-linux-gnu.so``), besides its folders (packages).
_MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")


def _top_module(name: str, *, folder: bool) -> str | None:
    """The module a top-level entry of a folder on the import path is imported as, if any
    (``bin/``, where an installer puts scripts, is none: the packages drop it)."""
    if folder:
        skipped = name.endswith((".dist-info", ".data")) or name in ("__pycache__", "bin", "..")
        return None if skipped else name
    return name.partition(".")[0] if name.endswith(_MODULE_SUFFIXES) else None


def _installed_modules(site: Path, *, by_path: bool) -> dict[str, tuple[str, str]]:
    """The top-level modules of the distributions installed in ``site``, each with its
    distribution (``six 1.17.0``) and its entry there (``six.py``, ``enum`` for a package),
    as their ``RECORD`` files list them; with ``by_path`` false, not those of a library the
    project requires by path (``./libs/mylib``)."""
    owners: dict[str, tuple[str, str]] = {}
    for record in sorted(site.glob("*.dist-info/RECORD")):
        origin = record.with_name("direct_url.json")
        if (
            not by_path
            and origin.is_file()
            and json.loads(origin.read_text()).get("url", "").startswith("file:")
        ):
            continue
        distribution = record.parent.name.removesuffix(".dist-info").replace("-", " ", 1)
        for row in csv.reader(record.read_text(errors="replace").splitlines()):
            top, module = _recorded_top(row[0] if row else "")
            if module is not None:
                owners.setdefault(module, (distribution, top))
    return owners


def _recorded_top(path: str) -> tuple[str, str | None]:
    """The top-level entry of a path a distribution's ``RECORD`` lists (``six.py``,
    ``anyio/_core/_fileio.py``), and the module it is imported as, if any."""
    top, separator, _ = path.partition("/")
    return top, _top_module(top, folder=bool(separator))


@functools.cache
def runtime_modules() -> frozenset[str]:
    """The top-level modules every package of a project holds besides the project's: this
    package and those of the distributions ``runtime.lock`` pins (``fastapi``, ``six``,
    ``idna``...), as installed with this package; a project's module of one of those names is
    refused by every build (:func:`refuse_shadowing`)."""
    modules = {PACKAGE}
    if not RUNTIME_LOCK.is_file():
        return frozenset(modules)
    for line in RUNTIME_LOCK.read_text().splitlines():
        name, pinned, _ = line.split("#")[0].strip().partition("==")
        if not pinned:
            continue
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:  # not for this platform (uvloop)
            continue
        modules.update(
            module for module in (_recorded_top(f.as_posix())[1] for f in files) if module
        )
    return frozenset(modules)


def refuse_shadowing(copied: Sequence[str], site: Path) -> None:
    """Refuse the project's top-level entries (``copied``, as :func:`copy_project` returns
    them) named as a module of a distribution installed in ``site``: in one folder, or the
    project's ahead of the dependencies on the import path, one hides or overwrites the
    other (a project's ``anyio/`` package merged into the runtime's breaks every server).
    A library the project requires by path (``./libs/mylib``) is its own: not a clash."""
    owners = {
        module: distribution
        for module, (distribution, _) in _installed_modules(site, by_path=False).items()
    }
    clashes = []
    for name in copied:
        module = _top_module(name, folder="." not in name)
        if module is not None and module in owners:
            clashes.append(f"{name} (the module {module} of {owners[module]})")
    if clashes:
        raise PackagingError(
            f"the project's {', '.join(clashes)} {'is' if len(clashes) == 1 else 'are'} named as "
            "a dependency the package holds: one would hide or overwrite the other; rename the "
            "project's"
        )


def refuse_standard_shadowing(site: Path, *, python_version: str) -> None:
    """Refuse the distributions installed in ``site`` that hold a top-level module or package
    named as a module of the standard library of the target's Python (``enum34``'s ``enum/``,
    ``typing``'s ``typing.py``): deployed, the dependencies come ahead of the standard library
    on the import path (Lambda's layer, an archive's root), so every import of it would get
    theirs, and the app could not start. A folder without ``__init__.py`` hides no module."""
    standard = standard_module_names(python_version)
    hiding = [
        f"{entry}{'/' if (site / entry).is_dir() else ''} (of {distribution})"
        for module, (distribution, entry) in sorted(_installed_modules(site, by_path=True).items())
        if module in standard and (site / entry).exists() and _hides(site / entry)
    ]
    if hiding:
        one = len(hiding) == 1
        raise PackagingError(
            f"the requirements install {', '.join(hiding)}, named as "
            f"{'a module' if one else 'modules'} of the standard library of Python "
            f"{python_version}: deployed, the dependencies come ahead of the standard library "
            f"on the import path, so every import of {'it' if one else 'them'} would get the "
            "requirement's, and the app could not start; leave out that requirement (a "
            "backport for an older Python, say), or pin what requires it to a version that "
            "does not"
        )


@functools.cache
def standard_module_names(python_version: str) -> frozenset[str]:
    """The top-level modules of the standard library of CPython ``python_version`` (the
    target's, whose list may differ from the build's own Python's)."""
    python = interpreter(python_version)
    if python == sys.executable:
        return frozenset(sys.stdlib_module_names)
    result = subprocess.run(
        [python, "-I", "-S", "-c", "import sys; print(*sorted(sys.stdlib_module_names))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise PackagingError(
            f"CPython {python_version} ({python}) could not list its standard library: "
            + (result.stderr.strip().splitlines() or ["failed"])[-1]
        )
    return frozenset(result.stdout.split())


def project_requirements(source: Path | None) -> Path | None:
    """The project's ``requirements.txt``, if it has one with any requirement in it."""
    if source is None or is_this_repository(source):
        return None
    path = source / "requirements.txt"
    if not path.is_file():
        return None
    lines = [line.split("#")[0].strip() for line in _requirements_text(path).splitlines()]
    return path if any(lines) else None


# Byte order marks and their encodings, as pip and uv read a requirements file (UTF-32's
# before UTF-16's, which begin them).
_BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def _requirements_text(path: Path) -> str:
    """The text of a requirements file: UTF-8, or the encoding its byte order mark names
    (Windows editors and PowerShell's ``>`` write UTF-8 with a BOM, or UTF-16)."""
    raw = path.read_bytes()
    encoding = next((name for bom, name in _BOMS if raw.startswith(bom)), "utf-8")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError:
        raise PackagingError(
            f"{path} is not UTF-8 text (nor UTF-16 or UTF-32 with a byte order mark): "
            "save it as UTF-8"
        ) from None


def tool(name: str) -> str:
    """An executable installed beside this interpreter, else on the PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise PackagingError(f"`{name}` is needed to package a project: pip install uv")
    return found


def run(
    command: list[str], what: str, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> str:
    """Run ``command`` (with ``env`` added to this environment); a failure raises
    :class:`PackagingError` with the output's tail (the credentials of the URLs it quotes, a
    requirement's or an index's, left out)."""
    result = subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, **env} if env else None,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise PackagingError(f"{what} failed:\n{without_url_credentials(tail)}")
    return result.stdout


def uv_platform(platform: str) -> str:
    """uv names platforms arch-first: ``manylinux2014_x86_64`` -> ``x86_64-manylinux2014``."""
    tag, _, arch = platform.partition("_")
    return f"{arch}-{tag}" if arch else platform


def resolve_requirements(
    source: Path | None,
    out: Path,
    *,
    python_version: str,
    platform: str,
    with_sources: bool = False,
    given: Sequence[str] = (),
) -> Path:
    """The runtime's pins plus the project's requirements and those ``given`` (checked by
    :func:`given_requirements`), resolved for the target, in ``out``.

    Paths in the project's requirements are the project folder's (installing the result
    takes them from there too), as are those of ``given``'s ``--find-links``. The runtime
    lock constrains the resolution: a project requirement that needs another version of a
    runtime dependency fails here, naming the conflict. Wheels for the target
    are preferred; a requirement published only as a source archive (docopt, jieba,
    langdetect...) is resolved from it, and the build checks with :func:`check_portable`
    that what it built from source is pure Python. ``with_sources`` writes the project's
    ``--index-url``, ``--extra-index-url`` and ``--find-links`` in ``out`` too, for an install
    from it to find what it resolved (a private index's packages); :func:`pinned` leaves them
    out.
    """
    lock = runtime_lock()
    user = project_requirements(source)
    if user is None and not given:
        shutil.copy(lock, out)
        return out
    here, out = Path(source or ".").resolve(), out.resolve()
    with tempfile.TemporaryDirectory() as scratch:
        inputs = [] if user is None else [user.resolve()]
        if given:
            listed = Path(scratch) / "requirements-given.txt"
            sources = _package_sources("\n".join(given), here)
            named = [line for line in given if not line.startswith("-")]
            listed.write_text("".join(f"{line}\n" for line in [*sources, *named]))
            inputs.append(listed)
        _compile(inputs, lock, out, here, python_version=python_version, platform=platform)
        texts = "\n".join(_requirements_text(path) for path in inputs)
    # A library the project edits (-e ./libs/mylib) is installed as it is now: an editable
    # install would point at this folder, which the package does not hold.
    resolved = [line.removeprefix("-e ") for line in out.read_text().splitlines()]
    sources = _package_sources(texts, here) if with_sources else []
    out.write_text("".join(f"{line}\n" for line in [*sources, *resolved]))
    return out


def _compile(
    inputs: Sequence[Path], lock: Path, out: Path, here: Path, *, python_version: str, platform: str
) -> None:
    """``uv pip compile`` of ``inputs`` with the runtime ``lock`` into ``out``, in the project
    folder ``here``, wheels first."""
    command = [
        tool("uv"),
        "pip",
        "compile",
        "--quiet",
        "--no-header",
        "--python-version",
        python_version,
        "--python-platform",
        uv_platform(platform),
        "-c",
        str(lock),
        str(lock),
        *[str(path) for path in inputs],
        "-o",
        str(out),
    ]
    named = " and ".join(
        str(path) if path.parent == here else "the requirements given" for path in inputs
    )
    what = f"resolving {named} with the runtime for CPython {python_version} ({platform})"
    # In the project folder: a requirement's path (./libs/mylib) is the project's, as pip and
    # uv take it from the working directory, wherever the build runs (--source).
    try:
        run([*command, "--only-binary", ":all:"], what, cwd=here)
    except PackagingError as wheels_only:
        try:
            run(command, what, cwd=here)
        except PackagingError:
            raise wheels_only from None  # not a missing wheel: its message says what


# The options of a requirements file saying where its packages are, as pip writes them and
# their short forms.
_SOURCE_OPTIONS = {
    "--index-url": "--index-url",
    "-i": "--index-url",
    "--extra-index-url": "--extra-index-url",
    "--find-links": "--find-links",
    "-f": "--find-links",
}


def _package_sources(text: str, project: Path) -> list[str]:
    """The lines of a requirements file's ``text`` saying where its packages are
    (``--index-url``, ``--extra-index-url``, ``--find-links``), a ``--find-links`` folder made
    absolute from the ``project`` folder (``./vendor``)."""
    sources = []
    for line in text.splitlines():
        words = line.split("#")[0].replace("=", " ", 1).split() if line.startswith("-") else []
        if len(words) != 2 or words[0] not in _SOURCE_OPTIONS:
            continue
        option, value = _SOURCE_OPTIONS[words[0]], words[1]
        if option == "--find-links" and "://" not in value:
            value = str(project / value)
        sources.append(f"{option} {value}")
    return sources


# A requirement by name, as PEP 508 writes it: the name, its extras, then what follows it
# (versions, a URL, markers).
_REQUIREMENT = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?\s*(?:\[[^\]]*\])?\s*(?:$|[=<>!~;@(])"
)
_OPTION_NAME = re.compile(r"^--?[A-Za-z][A-Za-z-]*$")


def given_requirements(requirements: object, *, option: str | None = None) -> list[str]:
    """The lines of ``requirements``, as a deployer is given them (AgentScope's
    ``requirements=[...]``): each a requirement by name (``openai``, ``openai>=1.40``,
    ``name @ https://...``, with markers) or an option of a requirements file saying where
    packages are (``--index-url``, ``--extra-index-url``, ``--find-links``, with its value).

    Anything else, which would put other options (``--target``...) in the install, raises
    :class:`PackagingError` naming the entry by its place: its text may hold a password. The
    place is ``requirements[0]``, or, for entries given with a command line's repeated
    ``option``, ``--requirement number 1``.

    >>> given_requirements(["openai>=1.40", "--index-url https://pypi.example/simple"])
    ['openai>=1.40', '--index-url https://pypi.example/simple']
    >>> try:
    ...     given_requirements(["openai", "--target=/srv"], option="--requirement")
    ... except PackagingError as refused:
    ...     print(refused.message.split(",")[0])
    --requirement number 2 is the option --target
    """
    if isinstance(requirements, str) or not isinstance(requirements, Sequence):
        raise PackagingError(
            f"requirements must be a list of requirement strings (requirements=['openai']), "
            f"not a {type(requirements).__name__}; the project's requirements.txt is read too"
        )
    accepted = "--index-url, --extra-index-url or --find-links (-i, -f), with its value"
    for place, entry in enumerate(requirements):
        where = f"{option} number {place + 1}" if option else f"requirements[{place}]"
        if not isinstance(entry, str):
            raise PackagingError(f"{where} is a {type(entry).__name__}, not text")
        if not entry.strip():
            raise PackagingError(f"{where} is empty: give a requirement, such as openai==1.40")
        if any(mark in entry for mark in "\n\r\0"):
            raise PackagingError(f"{where} spans lines: give one requirement per entry")
        if entry.rstrip().endswith("\\"):
            raise PackagingError(
                f"{where} ends with a backslash, which joins the next line to it in a "
                "requirements file: remove it"
            )
        words = entry.replace("=", " ", 1).split() if entry.lstrip().startswith("-") else []
        if words and words[0] not in _SOURCE_OPTIONS:
            option = words[0] if _OPTION_NAME.match(words[0]) else "an option"
            raise PackagingError(
                f"{where} is the option {option}, which requirements cannot pass to the "
                f"install: an option entry is {accepted}"
            )
        if words and len(words) != 2:
            raise PackagingError(f"{where} is not of the form {words[0]} VALUE: {accepted}")
        if not words and any(word.startswith("-") for word in entry.split()):
            raise PackagingError(
                f"{where} carries an option after the requirement: give the requirement "
                f"alone, and an option as an entry of its own ({accepted})"
            )
        if not words and not _REQUIREMENT.match(entry.strip()):
            raise PackagingError(
                f"{where} is not a requirement: name a published package (name, "
                "name==version, name @ URL); a library of the project's, by its path, goes "
                "in the project's requirements.txt"
            )
    return [entry.strip() for entry in requirements]


def check_portable(tags: dict[str, list[str]], platform: str) -> None:
    """Refuse distributions built from source on this machine for it alone.

    ``tags`` maps a distribution to its wheel tags (``py3-none-any``,
    ``cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64``...). A wheel for any
    platform, or a manylinux or musllinux one, runs on the target; one tagged for this
    machine (``linux_x86_64``) holds code compiled here, against this machine's libraries.

    >>> check_portable({"docopt": ["py2.py3-none-any"]}, "manylinux2014_x86_64")
    """
    built_here = {
        name: found for name, found in tags.items() if not any(_runs_anywhere(tag) for tag in found)
    }
    if built_here:
        listed = ", ".join(f"{name} ({' '.join(found)})" for name, found in built_here.items())
        raise PackagingError(
            f"no wheel for {platform} was published for {listed}, and building from source "
            "here compiled code for this machine, which would not run on the platform: pin a "
            f"version that has a {platform} wheel, or one that is pure Python"
        )


def _runs_anywhere(tag: str) -> bool:
    platforms = tag.rsplit("-", 1)[-1].split(".")
    return any(p == "any" or p.startswith(("manylinux", "musllinux")) for p in platforms)


def installed_tags(site: Path) -> dict[str, list[str]]:
    """The wheel tags of each distribution installed in ``site`` (its ``WHEEL`` file)."""
    tags: dict[str, list[str]] = {}
    for wheel in sorted(site.glob("*.dist-info/WHEEL")):
        name = wheel.parent.name.removesuffix(".dist-info")
        lines = wheel.read_text(errors="replace").splitlines()
        tags[name] = [line.partition(":")[2].strip() for line in lines if line.startswith("Tag:")]
    return tags


def pinned(requirements: Path) -> list[str]:
    """The ``name==version`` lines of a resolved requirements file (not its options, such as
    an ``--index-url``, which may hold a password)."""
    lines = [line.split("#")[0].strip() for line in requirements.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("--")]


# A requirement by name: pinned (``name==1.0``) or from a URL other than a file's.
_BY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?\s*(==|@\s*(?!file:))")


def refuse_path_requirements(resolved: Path, where: str) -> None:
    """Refuse the requirements of ``resolved`` given by a path (``./libs/mylib``, ``-e ...``,
    a ``file:`` URL), which ``where`` cannot install: the ModelStudio archive installs offline
    from its wheels, and SAM builds the layer in a folder of its own."""
    paths = [
        line.removeprefix("-e").strip() for line in pinned(resolved) if not _BY_NAME.match(line)
    ]
    if paths:
        named = ", ".join(paths)
        raise PackagingError(
            f"requirements.txt names {named}, {'a path' if len(paths) == 1 else 'paths'}, which "
            f"{where} cannot install: copy the library's package into the project instead (or "
            "publish it and require it by name)"
        )


def interpreter(python_version: str) -> str:
    """A CPython of ``python_version`` on this machine (this one, or one uv finds)."""
    if python_version == f"{sys.version_info.major}.{sys.version_info.minor}":
        return sys.executable
    reason = ""
    for path in (os.environ.get("PATH", ""), _path_past_shims()):
        result = subprocess.run(
            [tool("uv"), "python", "find", python_version],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PATH": path},
        )
        found = result.stdout.strip()
        if result.returncode == 0 and found:
            return found
        reason = reason or next(iter(result.stderr.strip().splitlines()), "")
    raise PackagingError(
        f"CPython {python_version} is needed to check the package: install it "
        f"(uv python install {python_version}) or choose another --python-version"
        + (f" (uv: {reason})" if reason else "")
    )


def _path_past_shims() -> str:
    """``PATH`` without pyenv's shims (one names every version pyenv has, and fails for those
    not selected), with the ``bin`` folder of each version pyenv has instead."""
    kept = [entry for entry in os.environ.get("PATH", "").split(os.pathsep) if entry]
    kept = [entry for entry in kept if Path(entry).name != "shims"]
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    versions = sorted(str(bin_dir) for bin_dir in root.glob("*/bin")) if root.is_dir() else []
    return os.pathsep.join([*kept, *versions])


# Nothing is imported before the package's folders are put on the path (only ``sys``,
# built in): a module of the standard library imported first (``json`` imports ``re`` and
# ``enum``) would hide one of a dependency's of its name, which the deployed app gets.
_IMPORT_PROBE = """
import sys
sys.path[:0] = sys.argv[2:]
import importlib
module_name, _, attribute = sys.argv[1].partition(":")
from agentscope_serverless.app.agent_app import importing_agent
from agentscope_serverless.errors import ConfigurationError
try:
    with importing_agent(sys.argv[1]):
        importlib.import_module(module_name)
except ConfigurationError as exc:
    print(f"cannot serve: {exc}")
    raise SystemExit(1)
except SyntaxError as exc:
    import os
    where = f" ({os.path.basename(exc.filename)}, line {exc.lineno})" if exc.filename else ""
    print(f"does not compile: {exc.msg}{where}")
    raise SystemExit(1)
except BaseException as exc:
    import os, traceback
    frames = list(traceback.walk_tb(exc.__traceback__))
    if (
        isinstance(exc, KeyError)
        and len(frames) > 1
        and frames[-1][0].f_globals.get("__name__") == "os"
        and frames[-1][0].f_code.co_name == "__getitem__"
    ):
        caller, line = frames[-2]
        where = f"{os.path.basename(caller.f_code.co_filename)}, line {line}"
        print(f"reads environment: {exc.args[0]}\t{where}")
        raise SystemExit(1)
    top = module_name.partition(".")[0]
    own = [f for f in frames if str(f[0].f_globals.get("__name__")).partition(".")[0] == top]
    if not isinstance(exc, (ImportError, SyntaxError, SystemExit, KeyboardInterrupt)):
        frame, line = (own or frames)[-1]
        where = f"{os.path.basename(frame.f_code.co_filename)}, line {line}"
        text = (str(exc).strip().splitlines() or [""])[0]
        print(f"raised: {type(exc).__name__}\t{where}\t{text}")
        raise SystemExit(1)
    where = ""
    if own:  # the line of the agent's own code importing what is missing
        frame, line = own[-1]
        where = f" ({os.path.basename(frame.f_code.co_filename)}, line {line})"
    print(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}{where}")
    raise SystemExit(1)
from agentscope_serverless.app.agent_app import load_agent_app
try:
    found = load_agent_app(sys.argv[1])  # imported: says what the attribute is not
    found.check()
except Exception as exc:
    print(f"cannot serve: {exc}")
    raise SystemExit(1)
"""
# Longest an agent's import may take in the build's check (a cold start's is much less).
IMPORT_TIMEOUT_SECONDS = 120.0
# How the probe starts its line about an agent that imports but cannot be served (no query
# handler, a handler that cannot be called...).
SERVE_MARK = "cannot serve: "
# How it starts its line about code that does not compile (a syntax error).
COMPILE_MARK = "does not compile: "
# How it starts its line about a module reading a variable the environment lacks
# (``os.environ["NAME"]``) as it is imported.
ENVIRONMENT_MARK = "reads environment: "
# How it starts its line about a module raising as it is imported (an SDK's client made
# without its key, a connection tried): its exception's name, where, and its first line.
RAISED_MARK = "raised: "


def check_agent_import(agent: str, paths: Sequence[Path], *, python_version: str) -> None:
    """Import ``agent`` (``module:attribute``) from ``paths`` alone, with the target's Python.

    No site-packages, no ``PYTHONPATH``, no working directory: only what the package holds.
    """
    module_name, _, attribute = agent.partition(":")
    if not module_name or not attribute:
        raise PackagingError(f"--agent {agent!r} must look like 'module:attribute'")
    python = interpreter(python_version)
    with tempfile.TemporaryDirectory() as empty:
        try:
            result = subprocess.run(
                [
                    python,
                    "-I",
                    "-S",
                    # Leave the package as it ships: no bytecode caches written into it.
                    "-B",
                    "-c",
                    _IMPORT_PROBE,
                    agent,
                    *[str(p) for p in paths],
                ],
                cwd=empty,
                capture_output=True,
                text=True,
                check=False,
                timeout=IMPORT_TIMEOUT_SECONDS,
            )
        except subprocess.TimeoutExpired:
            raise PackagingError(
                f"the agent {agent!r} was still importing after {IMPORT_TIMEOUT_SECONDS:g} s "
                "(waiting on a connection, say): it must import without the cloud's services: "
                "connect when it runs (its query handler, or @app.init)"
            ) from None
    if result.returncode != 0:
        # The agent's own words (an exception's message) may quote a secret it read from the
        # environment the build runs in.
        redact(environment_secrets())
        redact_aws_credentials()
        said = redacted(result.stdout.strip() or result.stderr.strip())
        reason = said.splitlines()[-1:] or ["failed"]
        if reason[0].startswith(ENVIRONMENT_MARK):
            name, _, where = reason[0].removeprefix(ENVIRONMENT_MARK).partition("\t")
            raise PackagingError(
                f"the agent {agent!r} reads the environment variable {name} as it is imported "
                f"({where}), and the build has none: give the build a placeholder ({name}=x "
                "before the command), or read it when the agent runs (its query handler, or "
                f"@app.init); deployed, it comes from the secret of AgentSecretsArn (a field "
                f"{name}), or the platform's environment"
            )
        if reason[0].startswith(RAISED_MARK):
            name, where, text = reason[0].removeprefix(RAISED_MARK).split("\t", 2)
            raise PackagingError(
                f"the agent {agent!r} raised {name} as it is imported ({where}): {text}; it must "
                "import without the cloud's environment and services: read secrets and connect "
                "when it runs (its query handler, or @app.init)"
            )
        if reason[0].startswith(COMPILE_MARK):
            raise PackagingError(
                f"the agent {agent!r} {reason[0]}: fix it (serving it, agentscope-serverless "
                f"serve --agent {agent}, says the same)"
            )
        if reason[0].startswith(SERVE_MARK):
            raise PackagingError(
                f"the agent {agent!r} cannot be served: {reason[0].removeprefix(SERVE_MARK)}"
            )
        raise PackagingError(
            f"the agent {agent!r} cannot be imported from the package's contents "
            f"(module {module_name!r}): {reason[0]}; run from the project folder or give "
            "--source, and list its third-party packages in requirements.txt"
        )


__all__ = [
    "LAMBDA_EXCLUDED",
    "PACKAGE",
    "PACKAGE_DIR",
    "SCRATCH_PREFIX",
    "TOOL_MODULES",
    "agents_of",
    "check_agent_import",
    "check_archivable",
    "check_portable",
    "copy_project",
    "copy_runtime",
    "given_requirements",
    "holds_code",
    "installed_tags",
    "interpreter",
    "is_this_repository",
    "pinned",
    "project_files",
    "project_requirements",
    "refuse_shadowing",
    "refuse_standard_shadowing",
    "resolve_requirements",
    "run",
    "runtime_lock",
    "runtime_modules",
    "secrets_left_out",
    "standard_module",
    "tool",
    "uv_platform",
]
