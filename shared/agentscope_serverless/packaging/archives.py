"""AgentRun-style and ModelStudio-style archives of a user's project, built without Docker.

The archive holds the project's code (``project_root``: the folder with the agent's modules
and its ``requirements.txt``), the runtime, and every dependency installed for the
platform's Linux target (``manylinux2014_x86_64``, CPython 3.12 by default) from the
runtime's pinned set and the project's requirements (see :mod:`.project`), whatever the
build machine is. Before writing it, the agent is imported from its contents alone.

- **AgentRun**: one zip holding a flat site-packages (the package and every dependency, as
  Lambda-style runtimes expect) and ``agentrun.json``: entry command, port, runtime and
  resources.
- **ModelStudio**: one zip holding ``deploy_starter/`` (``main.py`` and ``config.yml``), the
  project's code and the runtime at its root, every dependency wheel under ``wheels/``, and
  ``requirements.txt``, so the platform installs offline with the ``SETUP_CMD`` of
  ``config.yml``.

A build fails with :class:`PackagingError` when the archive is above the platform's limit.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import stat
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from agentscope_serverless.errors import ConfigurationError, PackagingError
from agentscope_serverless.packaging import project
from agentscope_serverless.settings import (
    check_setting_variables,
    near_miss_message,
    near_miss_variables,
)

AGENTRUN_MAX_ZIP_BYTES = 500 * 1024 * 1024
MODELSTUDIO_MAX_ZIP_BYTES = 500 * 1024 * 1024
DEFAULT_PYTHON = "3.12"
DEFAULT_PLATFORM = "manylinux2014_x86_64"
DEFAULT_AGENT = "agentscope_serverless.agents.demo:app"
PACKAGE = "agentscope_serverless"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ArchiveReport:
    """What a build produced."""

    path: Path
    size_bytes: int
    unpacked_bytes: int
    files: int
    limit_bytes: int
    # The project's secrets the archive leaves out (``.env``, ``.aws/``...), as paths in it.
    left_out: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for humans: path, size and the share of the platform's limit (on the
        zipped size)."""
        share = 100 * self.size_bytes / self.limit_bytes
        return (
            f"{self.path} {self.size_bytes / 1e6:.1f} MB zipped, {share:.0f}% of the "
            f"{self.limit_bytes / 2**20:.0f} MiB limit on the archive "
            f"({self.unpacked_bytes / 1e6:.1f} MB unpacked, {self.files} files)"
        )


def _quiet(_: str) -> None:
    return None


def _scratch(out_dir: Path, archive: Path) -> Path:
    """A folder of this build's own in ``out_dir``, where it assembles ``archive``: another
    build into the same folder at once has its own (and packaging leaves both out)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file there (--out an archive's path), or above it
        raise PackagingError(
            f"the output folder {out_dir} cannot be made ({exc.strerror}): --out names the "
            f"folder the archive goes in, {archive.name} in it"
        ) from None
    _remove_stale_scratch(out_dir)
    prefix = f"{project.SCRATCH_PREFIX}{archive.stem}-{_owner(os.getpid())}-"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=out_dir))


@contextmanager
def _build_folder(out_dir: Path, archive: Path) -> Iterator[Path]:
    """The folder of this build (:func:`_scratch`), removed when the build ends, whichever
    way. A stop (Ctrl-C, a signal's exception) may come before the folder is in hand, or
    while it is removed: then every build folder of this process in ``out_dir`` goes (the
    process is stopping), and a removal cut short is done again."""
    scratch: Path | None = None
    try:
        scratch = _scratch(out_dir, archive)
        yield scratch
    except Exception:
        raise
    except BaseException:
        _remove_folders(out_dir.glob(f"{project.SCRATCH_PREFIX}*-{_owner(os.getpid())}-*"))
        raise
    finally:
        _remove_folders([scratch] if scratch is not None else [])


def _remove_folders(folders: Iterable[Path]) -> None:
    """Remove ``folders``, even when a stop comes meanwhile (its exception goes on once they
    are gone: a stop signal's handler raises once)."""
    for folder in list(folders):
        try:
            shutil.rmtree(folder, ignore_errors=True)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise


def _owner(pid: int) -> str:
    """How a build folder's name tells the process building in it: this machine's (a hash
    of its host name: an output folder may be shared) process ``pid``."""
    return f"{zlib.crc32(socket.gethostname().encode()):08x}-pid{pid}"


# The end of a build folder's name: the process building in it (_owner), then mkdtemp's.
_SCRATCH_OWNER = re.compile(r"-([0-9a-f]{8}-pid([0-9]+))-[^-]*$")


def _remove_stale_scratch(out_dir: Path) -> None:
    """Remove the build folders in ``out_dir`` whose process is gone: a build killed (SIGKILL,
    a machine stopped) could not remove its own, a copy of the project and every dependency.
    One whose process still runs is another build's, kept; so is one of another machine, or
    whose name tells no process (an older version's): nothing here tells whether it is in
    use."""
    for folder in out_dir.glob(f"{project.SCRATCH_PREFIX}*"):
        found = _SCRATCH_OWNER.search(folder.name)
        if not found or not folder.is_dir():
            continue
        pid = int(found.group(2))
        if found.group(1) == _owner(pid) and not _running(pid):
            shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's too)."""
    if pid <= 0:
        return True  # no process's: os.kill would signal a group
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _archived_mode(path: Path) -> int:
    """The mode a file is unpacked with: readable by every user (the platform's service may
    not run as the builder), writable by its owner alone, executable if it was."""
    executable = path.stat().st_mode & stat.S_IXUSR
    return stat.S_IFREG | (0o755 if executable else 0o644)


# The time of every archived file when SOURCE_DATE_EPOCH is not set: the earliest a zip
# archive can say, 1980-01-01 00:00 UTC, as seconds since 1970.
ZIP_EPOCH = 315_532_800


def _archived_epoch() -> int:
    """The time every archived file is given, whatever its own, as seconds since 1970 (UTC):
    ``SOURCE_DATE_EPOCH`` if set, as reproducible builds name it, else :data:`ZIP_EPOCH`; so
    two builds of an unchanged project give the same bytes."""
    given = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not given:
        return ZIP_EPOCH
    if not given.isdigit():
        raise PackagingError(
            f"SOURCE_DATE_EPOCH is {given!r}: give a time as whole seconds since 1970 (UTC), "
            "such as the last commit's (git log -1 --format=%ct), or unset it"
        )
    # A zip archive says times from 1980 to 2107.
    return min(max(int(given), ZIP_EPOCH), 4_354_819_199)


def _archived_time() -> tuple[int, int, int, int, int, int]:
    """:func:`_archived_epoch` as a zip archive's entries say it."""
    return time.gmtime(_archived_epoch())[:6]


def _zip_tree(
    root: Path, archive: Path, limit: int, progress: Progress, partial: Path
) -> ArchiveReport:
    """Zip ``root`` into ``partial``, then put it in place of ``archive`` at once: an archive
    of an earlier build stays whole until this one is. The entries are in the order of their
    paths, each with :func:`_archived_time` and :func:`_archived_mode`, and each file is read
    a piece at a time (a model of gigabytes is not held in memory)."""
    files = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.as_posix())
    date_time = _archived_time()
    unpacked = 0
    zipped: dict[str, int] = {}
    with zipfile.ZipFile(partial, "w") as zf:
        for i, path in enumerate(files, 1):
            info = zipfile.ZipInfo(path.relative_to(root).as_posix(), date_time)
            info.external_attr = _archived_mode(path) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            # Its size known ahead, a file above 2 GiB gets the ZIP64 fields it needs.
            info.file_size = path.stat().st_size
            with path.open("rb") as source, zf.open(info, "w") as entry:
                shutil.copyfileobj(source, entry, 1 << 20)
            unpacked += info.file_size
            zipped[info.filename] = info.compress_size
            if i % 500 == 0 or i == len(files):
                progress(f"zipped {i}/{len(files)} files")
    report = ArchiveReport(archive, partial.stat().st_size, unpacked, len(files), limit)
    if report.size_bytes > limit:
        raise PackagingError(
            f"the archive is {report.size_bytes} bytes, above the platform's limit of {limit} "
            f"bytes ({limit / 2**20:.1f} MiB); the largest, zipped: {_largest(zipped)}. "
            f"{_MAKE_SMALLER}, or drop dependencies the agent does not need"
        )
    partial.replace(archive)
    return report


# What to do about a project its own files make too big; the platform's limit is fixed.
_MAKE_SMALLER = (
    "Move big data (a model, a data set) out of the project folder and load it at run time "
    "(from object storage, say)"
)
# How many of the largest entries an archive above its limit names.
LARGEST_SHOWN = 5


def _largest(zipped: Mapping[str, int]) -> str:
    """The largest entries of an archive whose files zip to ``zipped`` bytes (by path), as
    "models/big.bin (540.0 MB)": each file at the top, each folder there (a dependency of a
    flat site-packages, or one of the project's) with its largest file named, and each wheel
    of a ``wheels/`` folder (a ModelStudio archive's dependencies)."""
    totals: dict[str, int] = {}
    biggest: dict[str, str] = {}
    for path, size in zipped.items():
        top = path.split("/")[0]
        top = path if top == "wheels" else top
        totals[top] = totals.get(top, 0) + size
        if top not in biggest or zipped[biggest[top]] < size:
            biggest[top] = path
    shown = []
    for top in sorted(totals, key=lambda name: (-totals[name], name))[:LARGEST_SHOWN]:
        total, largest = f"{totals[top] / 1e6:.1f} MB", biggest[top]
        if largest == top:
            shown.append(f"{top} ({total})")
        else:
            shown.append(f"{top}/ ({total}; {largest} {zipped[largest] / 1e6:.1f} MB)")
    return ", ".join(shown)


def _refuse_big_project(project_root: Path, leave_out: Sequence[Path], limit: int) -> None:
    """Refuse, before any dependency is resolved or installed, a project whose own files
    already zip above ``limit``, naming the largest. Their sizes are added up first: only
    when the sum is above the limit are the files compressed (the largest first, and no
    further than the limit) to tell, as some shrink a lot."""
    files = project.project_files(project_root, leave_out=leave_out)
    sizes = {path: path.stat().st_size for path in files}
    if sum(sizes.values()) <= limit:
        return
    zipped: dict[str, int] = {}
    total = 0
    for path in sorted(files, key=lambda p: (-sizes[p], p)):
        zipped[path.relative_to(project_root).as_posix()] = size = _deflated_size(path)
        total += size
        if total > limit:
            raise PackagingError(
                f"the project's own files zip to more than the platform's limit of {limit} "
                f"bytes ({limit / 2**20:.1f} MiB) on the archive, before any dependency; the "
                f"largest, zipped: {_largest(zipped)}. {_MAKE_SMALLER}"
            )


def _deflated_size(path: Path) -> int:
    """The bytes ``path`` takes zipped (deflated as :func:`_zip_tree` does), read a piece at
    a time."""
    deflate = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
    size = 0
    with path.open("rb") as source:
        while piece := source.read(1 << 20):
            size += len(deflate.compress(piece))
    return size + len(deflate.flush())


def _drop_install_leftovers(site_packages: Path) -> None:
    """Drop what ``uv pip install --target`` writes beside the packages: its ``.lock`` file and
    the ``bin/`` scripts, whose first line names the building machine's Python."""
    (site_packages / ".lock").unlink(missing_ok=True)
    shutil.rmtree(site_packages / "bin", ignore_errors=True)


def _drop_bytecode(root: Path) -> None:
    for cache in list(root.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_ARCHIVE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _checked_name(name: str) -> str:
    """The app's name, which names the archive and its build folder inside ``out_dir``."""
    if not _ARCHIVE_NAME.match(name):
        raise PackagingError(
            f"{name!r} is not an app name: up to 128 letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (it names the archive in the output folder)"
        )
    return name


_PYTHON_VERSION = re.compile(r"^3\.[0-9]{1,2}$")


def _checked_python(version: str) -> str:
    """The platform's CPython, as its runtime names it (``python3.12``): major.minor."""
    if not _PYTHON_VERSION.match(version):
        raise PackagingError(
            f"--python-version {version!r}: give the platform's Python as major.minor, such as "
            f"{DEFAULT_PYTHON} (its runtime is named python{DEFAULT_PYTHON}, without a patch level)"
        )
    return version


def _checked_environment(environment: Mapping[str, object] | None) -> dict[str, str]:
    """Variables the service starts with: names a shell accepts, one-line values, none named
    almost as a setting (:func:`~agentscope_serverless.settings.near_miss_variables`: the
    service would ignore it), the settings' values valid as the service will read them. A
    None value is left out and a number written as text, as AgentScope does."""
    misses = near_miss_variables(environment or {})
    if misses:
        raise PackagingError(
            f"the environment names {near_miss_message(misses)}, which is no setting: the "
            "service would ignore it"
        )
    checked: dict[str, str] = {}
    for key, value in (environment or {}).items():
        if not _ENV_NAME.match(key):
            raise PackagingError(f"{key!r} is not an environment variable name")
        if value is None:
            continue
        if not isinstance(value, str | int | float):
            raise PackagingError(f"the value of {key} is a {type(value).__name__}, not text")
        text = str(value)
        if "\n" in text or "\r" in text:
            raise PackagingError(f"the value of {key} spans lines: give it on one line")
        if "\0" in text:
            raise PackagingError(
                f"the value of {key} holds a NUL character, which no environment can carry"
            )
        checked[key] = text
    try:
        check_setting_variables(checked)
    except ConfigurationError as exc:
        raise PackagingError(exc.message) from None
    return checked


def serve_command(agent: str, port: int) -> list[str]:
    """The command that serves ``agent`` on ``port`` from an unpacked archive."""
    return [
        "python3",
        "-m",
        f"{PACKAGE}.serve",
        "--host",
        "0.0.0.0",  # noqa: S104 - the platform routes to the container's port
        "--port",
        str(port),
        "--agent",
        agent,
    ]


@dataclass(frozen=True)
class AgentRunResources:
    """What the AgentRun runtime gets (``agentrun.json``; AgentScope's defaults)."""

    cpu: float = 2
    memory: int = 2048
    session_concurrency_limit: int = 200
    session_idle_timeout_seconds: int = 3600


def build_agentrun_archive(
    project_root: Path,
    out_dir: Path,
    *,
    name: str = "agentscope-serverless",
    agent: str = DEFAULT_AGENT,
    port: int = 8090,
    python_version: str = DEFAULT_PYTHON,
    platform: str = DEFAULT_PLATFORM,
    environment: dict[str, str] | None = None,
    max_zip_bytes: int = AGENTRUN_MAX_ZIP_BYTES,
    progress: Progress = _quiet,
    resources: AgentRunResources | None = None,
    requirements: Sequence[str] = (),
) -> ArchiveReport:
    """Build ``<out_dir>/<name>-agentrun.zip``: code, dependencies and ``agentrun.json``.

    The manifest's ``entrypoint.command`` serves ``agent`` on ``port`` with the unpacked
    archive as working directory; ``environment`` (for example ``AUTH_KEYS_BACKEND``) is
    the service's environment; ``resources`` (default: :class:`AgentRunResources`) the
    runtime's CPU, memory and session limits; ``requirements`` (AgentScope's
    ``requirements=[...]``, see :func:`~.project.given_requirements`) are installed with the
    project's ``requirements.txt``. Raises :class:`PackagingError` above ``max_zip_bytes``.
    """
    resources = resources or AgentRunResources()
    name, env = _checked_name(name), _checked_environment(environment)
    given = project.given_requirements(requirements)
    python_version = _checked_python(python_version)
    out_dir = out_dir.resolve()  # the import check runs in a folder of its own
    archive = out_dir / f"{name}-agentrun.zip"
    project.check_archivable(project_root, leave_out=(out_dir, archive))
    _refuse_big_project(project_root, (out_dir, archive), max_zip_bytes)
    left_out = tuple(project.secrets_left_out(project_root))
    with _build_folder(out_dir, archive) as scratch:
        staging = scratch / "archive"
        staging.mkdir()
        requirements_file = scratch / "requirements.txt"
        progress(f"resolving the requirements for {platform}, CPython {python_version}")
        resolved = project.resolve_requirements(
            project_root,
            requirements_file,
            python_version=python_version,
            platform=platform,
            with_sources=True,
            given=given,
        )
        progress(f"installing dependencies for {platform}, CPython {python_version}")
        project.run(
            [
                project.tool("uv"),
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                # Copies, not uv's hard links to its cache: the build then owns every file
                # of its folder, and nothing it writes there (the project's files go in
                # beside these) can reach the cache or a virtualenv installed from it.
                "--link-mode",
                "copy",
                "--target",
                str(staging),
                "--python-platform",
                project.uv_platform(platform),
                "--python-version",
                python_version,
                "-r",
                str(resolved.resolve()),
            ],
            "installing the dependencies",
            cwd=project_root.resolve(),  # a requirement's path is the project folder's
        )
        project.check_portable(project.installed_tags(staging), platform)
        project.refuse_standard_shadowing(staging, python_version=python_version)
        _drop_install_leftovers(staging)  # before the project's files: a bin/ may be theirs
        progress("copying the runtime and the project")
        project.copy_runtime(staging)
        project.copy_project(
            project_root, staging, leave_out=(out_dir, archive, scratch), installed=staging
        )
        # Installed above, and its index URLs may hold a password (--extra-index-url
        # https://user:token@...): the archive keeps no requirements file, as a SAM layer.
        (staging / "requirements.txt").unlink(missing_ok=True)
        _drop_bytecode(staging)
        progress(f"checking that {agent} imports from the archive")
        project.check_agent_import(agent, [staging], python_version=python_version)
        manifest = {
            "name": name,
            "runtime": f"python{python_version}",
            "entrypoint": {"command": serve_command(agent, port), "port": port},
            "resources": {"cpu": resources.cpu, "memory": resources.memory},
            "session_concurrency_limit": resources.session_concurrency_limit,
            "session_idle_timeout_seconds": resources.session_idle_timeout_seconds,
            "environment": env,
            "health_check": {"path": "/health", "port": port},
        }
        (staging / "agentrun.json").write_text(json.dumps(manifest, indent=2) + "\n")
        progress("zipping")
        report = _zip_tree(staging, archive, max_zip_bytes, progress, scratch / archive.name)
    return replace(report, left_out=left_out)


MODELSTUDIO_MAIN = '''"""Start the agent service: load .env, then become CMD of config.yml.

config.yml holds one ``KEY: "value"`` per line, each value a JSON string. ``$PORT`` in CMD is
the environment's PORT, else config.yml's; ``$HOST`` is config.yml's; a leading ``python3``
is this interpreter, so the service runs where the SETUP_CMD installed it.
"""

import json
import os
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def read_config():
    config = {}
    for line in (HERE / "config.yml").read_text().splitlines():
        key, separator, value = line.partition(": ")
        if separator and not line.startswith("#"):
            config[key.strip()] = json.loads(value)
    return config


def load_env():
    # One NAME=value per line, the value as given: its spaces kept, and nothing but a line
    # feed ending it (a form feed or U+2028 is part of it).
    env_file = HERE / ".env"
    if env_file.exists():
        for line in env_file.read_text(encoding="utf-8").split("\\n"):
            key, separator, value = line.partition("=")
            if separator and not line.startswith("#"):
                os.environ.setdefault(key, value)


def main():
    load_env()
    config = read_config()
    port = os.environ.setdefault("PORT", config["PORT"])
    command = [
        part.replace("$HOST", config["HOST"]).replace("$PORT", port)
        for part in shlex.split(config["CMD"])
    ]
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
    os.chdir(HERE.parent)
    # exec, not a child: the platform's signals reach the server itself.
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
'''


def _config_yml(name: str, agent: str, port: int, requirements: str) -> str:
    command = serve_command(agent, port)
    command[command.index("--host") + 1] = "$HOST"
    command[command.index("--port") + 1] = "$PORT"
    values = {
        "APP_NAME": name,
        "HOST": "0.0.0.0",  # noqa: S104 - the platform routes to the container's port
        "PORT": str(port),
        "SETUP_CMD": f"pip install --no-index --find-links wheels -r {requirements}",
        "FC_RUN_CMD": "python3 deploy_starter/main.py",
        "CMD": shlex.join(command),
        "TELEMETRY_ENABLE": "false",
    }
    # JSON strings are YAML strings too: any value survives quoting both ways.
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items())


def build_modelstudio_archive(
    project_root: Path,
    out_dir: Path,
    *,
    name: str = "agentscope-serverless",
    agent: str = DEFAULT_AGENT,
    port: int = 8080,
    python_version: str = DEFAULT_PYTHON,
    platform: str = DEFAULT_PLATFORM,
    environment: dict[str, str] | None = None,
    max_zip_bytes: int = MODELSTUDIO_MAX_ZIP_BYTES,
    progress: Progress = _quiet,
    requirements: Sequence[str] = (),
) -> ArchiveReport:
    """Build ``<out_dir>/<name>-modelstudio.zip``: wheels, ``config.yml`` and a starter.

    The platform runs ``SETUP_CMD`` (an offline ``pip install`` of the bundled wheels) in the
    unpacked archive, then ``FC_RUN_CMD`` (``deploy_starter/main.py``), which loads
    ``deploy_starter/.env`` (``environment``) and serves ``agent``. ``requirements`` are
    bundled with the project's, as :func:`build_agentrun_archive` installs them. Raises
    :class:`PackagingError` above ``max_zip_bytes``.
    """
    name, env = _checked_name(name), _checked_environment(environment)
    given = project.given_requirements(requirements)
    python_version = _checked_python(python_version)
    out_dir = out_dir.resolve()  # the import check runs in a folder of its own
    archive = out_dir / f"{name}-modelstudio.zip"
    if "deploy_starter" in project.check_archivable(project_root, leave_out=(out_dir, archive)):
        raise PackagingError(
            "the project has a deploy_starter folder, the place of the archive's own "
            "starter (main.py, config.yml): rename it, or remove it if an earlier "
            "packaging left it"
        )
    _refuse_big_project(project_root, (out_dir, archive), max_zip_bytes)
    left_out = tuple(project.secrets_left_out(project_root))
    with _build_folder(out_dir, archive) as scratch:
        staging = scratch / "archive"
        staging.mkdir()
        requirements_file = scratch / "requirements.txt"
        wheels = staging / "wheels"
        progress(f"resolving the requirements for {platform}, CPython {python_version}")
        resolved = project.resolve_requirements(
            project_root,
            requirements_file,
            python_version=python_version,
            platform=platform,
            with_sources=True,
            given=given,
        )
        project.refuse_path_requirements(resolved, "the ModelStudio archive")
        progress(f"downloading dependency wheels for {platform}, CPython {python_version}")
        project.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--platform",
                platform,
                "--python-version",
                python_version,
                "--implementation",
                "cp",
                "--dest",
                str(wheels),
                "-r",
                str(resolved),
            ],
            "downloading the dependency wheels",
            cwd=project_root.resolve(),  # a --find-links path is the project folder's
        )
        _build_source_archives(wheels, platform, progress)
        progress("copying the runtime and the project")
        project.copy_runtime(staging)
        copied = project.copy_project(project_root, staging, leave_out=(out_dir, archive, scratch))
        # The platform's SETUP_CMD installs this: every pin, the project's included.
        pins = _pinned_to_wheels(resolved, wheels)
        (staging / "requirements.txt").write_text("\n".join(pins) + "\n")
        _drop_bytecode(staging)
        progress(f"checking that {agent} imports from the archive")
        _check_modelstudio_import(staging, agent, python_version, copied)
        starter = staging / "deploy_starter"
        starter.mkdir()
        (starter / "main.py").write_text(MODELSTUDIO_MAIN)
        (starter / "config.yml").write_text(_config_yml(name, agent, port, "requirements.txt"))
        if env:
            (starter / ".env").write_text(
                "".join(f"{k}={v}\n" for k, v in env.items()), encoding="utf-8", newline=""
            )
        progress("zipping")
        report = _zip_tree(staging, archive, max_zip_bytes, progress, scratch / archive.name)
    return replace(report, left_out=left_out)


# A requirement from a URL: ``name[extras] @ URL ; marker``.
_DIRECT_URL = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<extras>\[[^\]]*\])?\s*@\s*\S+(?P<marker>\s*;.*)?$"
)


def _pinned_to_wheels(resolved: Path, wheels: Path) -> list[str]:
    """The pins of ``resolved`` (:func:`~.project.pinned`), each ``name @ URL`` one pinned to
    the version of its wheel in ``wheels`` instead (``name==1.0``): the offline install would
    fetch the URL again, and the URL may hold a password (``https://user:token@...``), which
    the archive must not, as the AgentRun archive and the SAM layer keep no requirements."""
    # name-version(-build)-python-abi-platform.whl, the name with ``_`` for ``-`` and ``.``
    versions = {}
    for wheel in wheels.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        versions[name.lower()] = version
    pins = []
    for line in project.pinned(resolved):
        direct = _DIRECT_URL.match(line)
        if direct is not None:
            version = versions[re.sub(r"[-_.]+", "_", direct["name"]).lower()]
            line = f"{direct['name']}{direct['extras'] or ''}=={version}{direct['marker'] or ''}"
        pins.append(line)
    return pins


def _build_source_archives(wheels: Path, platform: str, progress: Progress) -> None:
    """Turn each source archive ``pip download`` brought (a requirement with no wheel for
    ``platform``) into a wheel beside the others; refuse any that compiles code."""
    for source in sorted(p for p in wheels.iterdir() if p.suffix != ".whl"):
        progress(f"building a wheel of {source.name}: no {platform} wheel was published")
        project.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--wheel-dir",
                str(wheels),
                str(source),
            ],
            f"building a wheel of {source.name}",
            # The wheel's files are dated so (as the archive's), not when it was built: two
            # builds of an unchanged project give the same bytes.
            env={"SOURCE_DATE_EPOCH": str(_archived_epoch())},
        )
        source.unlink()
    # name-version(-build)-python-abi-platform.whl
    tags = {w.name: ["-".join(w.stem.split("-")[-3:])] for w in wheels.glob("*.whl")}
    project.check_portable(tags, platform)


def _check_modelstudio_import(
    staging: Path, agent: str, python_version: str, copied: list[str]
) -> None:
    """Install the bundled wheels offline, as ``SETUP_CMD`` does, then import the agent (the
    project's top-level entries ``copied`` ahead of them on the import path, as served)."""
    with tempfile.TemporaryDirectory() as installed:
        project.run(
            [
                project.tool("uv"),
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--offline",
                "--no-index",
                "--find-links",
                str(staging / "wheels"),
                "--target",
                installed,
                "--python-version",
                python_version,
                "-r",
                str(staging / "requirements.txt"),
            ],
            "installing the bundled wheels",
        )
        project.refuse_shadowing(copied, Path(installed))
        project.refuse_standard_shadowing(Path(installed), python_version=python_version)
        project.check_agent_import(agent, [staging, Path(installed)], python_version=python_version)


__all__ = [
    "AGENTRUN_MAX_ZIP_BYTES",
    "MODELSTUDIO_MAX_ZIP_BYTES",
    "AgentRunResources",
    "ArchiveReport",
    "build_agentrun_archive",
    "build_modelstudio_archive",
    "serve_command",
]
