"""How a sandbox process is confined: the bubblewrap command line and the resource limits.

Each sandbox process runs under ``bwrap`` in new user, PID, network, IPC, UTS and cgroup
namespaces, with every capability dropped, as an unprivileged uid, seeing only read-only
system directories, its own workspace (read-write) at ``/workspace``, a private ``/tmp``,
``/proc`` and ``/dev``. ``prlimit`` then sets the resource limits right before the program
runs. It runs *inside* the new user namespace on purpose: the kernel counts processes
(``RLIMIT_NPROC``) per user namespace, so each sandbox gets its own process budget, and a
fork bomb in one sandbox cannot starve the others.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from agentscope_serverless.errors import ConfigurationError

SANDBOX_UID = 65534
SANDBOX_GID = 65534
WORKSPACE = "/workspace"

# Directories of the host's file system the sandbox may read (the system, nothing of users).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Single entries of /etc that programs need; the rest of /etc stays invisible.
ETC_ENTRIES = (
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/mime.types",
)


@dataclass(frozen=True)
class Limits:
    """Resource limits of every process of a sandbox, and the wall clock of one call.

    >>> Limits().prlimit_arguments()[:2]
    ['--cpu=60:60', '--as=1073741824:1073741824']
    """

    cpu_seconds: int = 60
    memory_bytes: int = 1024**3
    file_size_bytes: int = 64 * 1024**2
    processes: int = 64
    open_files: int = 256
    call_timeout_seconds: float = 60.0
    interpreter_cpu_seconds: int = 3600
    # Totals of the whole sandbox (kernel-enforced where the host allows, see ``jail``).
    total_memory_bytes: int = 1024**3
    workspace_bytes: int = 1024**3
    total_processes: int = 128
    cpus: float = 1.0

    @property
    def tmp_bytes(self) -> int:
        """Size of the sandbox's ``/tmp`` tmpfs (its pages count against the memory total)."""
        return max(1024**2, self.total_memory_bytes // 2)

    @property
    def shm_bytes(self) -> int:
        """Size of the sandbox's ``/dev/shm`` tmpfs."""
        return max(1024**2, self.total_memory_bytes // 4)

    def prlimit_arguments(self) -> list[str]:
        """``prlimit`` options setting each limit (soft and hard alike, so none can be raised)."""
        pairs = (
            ("cpu", f"{self.cpu_seconds}:{self.cpu_seconds}"),
            ("as", f"{self.memory_bytes}:{self.memory_bytes}"),
            ("fsize", f"{self.file_size_bytes}:{self.file_size_bytes}"),
            ("nproc", f"{self.processes}:{self.processes}"),
            ("nofile", f"{self.open_files}:{self.open_files}"),
            ("core", "0:0"),
        )
        return [f"--{name}={value}" for name, value in pairs]

    def interpreter_prlimit_arguments(self) -> list[str]:
        """The same limits for the long-lived Python interpreter, except CPU time: it gets
        ``cpu_seconds`` per call (renewed by the interpreter before each cell) up to
        ``interpreter_cpu_seconds`` over its life."""
        cpu = f"--cpu={self.cpu_seconds}:{max(self.cpu_seconds, self.interpreter_cpu_seconds)}"
        return [cpu, *self.prlimit_arguments()[1:]]


@dataclass(frozen=True)
class Toolchain:
    """The host programs a sandbox needs, found once at start-up."""

    bwrap: str
    prlimit: str
    python: str

    @classmethod
    def find(cls, python: str) -> Toolchain:
        """Locate ``bwrap`` and ``prlimit``; fail with how to install what is missing."""
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise ConfigurationError(
                "bwrap (bubblewrap) is not installed; install it with "
                "`apt-get install -y bubblewrap`"
            )
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise ConfigurationError(
                "prlimit is not installed; install it with `apt-get install -y util-linux`"
            )
        if not python.startswith("/usr/") or not os.access(python, os.X_OK):
            raise ConfigurationError(
                f"the sandbox Python {python!r} must be an executable under /usr "
                "(the only system directory sandboxes see)"
            )
        return cls(bwrap=bwrap, prlimit=prlimit, python=python)


def check_reachable(directory: Path, uid: int) -> None:
    """Fail clearly when ``uid`` cannot walk down to ``directory`` (bwrap binds from there)."""
    for ancestor in [*reversed(directory.resolve().parents), directory.resolve()]:
        status = ancestor.stat()
        if status.st_uid != uid and not status.st_mode & stat.S_IXOTH:
            raise ConfigurationError(
                f"sandboxes run as uid {uid} and cannot reach {directory}: {ancestor} is not "
                f"searchable by others (chmod o+x {ancestor}, or choose another --root)"
            )


PASSWD = (
    "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
    f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{WORKSPACE}:/bin/sh\n"
)
GROUP = f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\n"
# The only environment of bwrap itself (PID 1 of the sandbox, whose environ is readable there).
BWRAP_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class JailCommand:
    """How to start a confined program: ``argv``, plus the files bwrap reads from inherited
    descriptors (its options and the small files it writes inside), so that no host path
    appears in the command line the sandbox can read in ``/proc/1/cmdline``."""

    argv: list[str]
    options: bytes
    files: tuple[bytes, ...]


def bwrap_command(
    toolchain: Toolchain,
    limits: Limits,
    workspace: Path,
    program: list[str],
    fds: tuple[int, int, int] = (3, 4, 5),
) -> JailCommand:
    """The command running ``program`` confined, with ``workspace`` as its files.

    bwrap reads its options, ``/etc/passwd`` and ``/etc/group`` from the descriptors ``fds``.
    """
    options_fd, passwd_fd, group_fd = fds
    options = [
        "--unshare-all",
        "--unshare-user",
        "--cap-drop",
        "ALL",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        WORKSPACE,
        "--setenv",
        "TMPDIR",
        "/tmp",  # noqa: S108 - the sandbox's private tmpfs
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
    ]
    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            options += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            options += ["--ro-bind", directory, directory]
    for entry in ETC_ENTRIES:
        options += ["--ro-bind-try", entry, entry]
    options += [
        "--perms",
        "0644",
        "--file",
        str(passwd_fd),
        "/etc/passwd",
        "--perms",
        "0644",
        "--file",
        str(group_fd),
        "/etc/group",
        "--bind",
        str(workspace),
        WORKSPACE,
        "--size",
        str(limits.tmp_bytes),
        "--tmpfs",
        "/tmp",  # noqa: S108 - a fresh tmpfs inside the sandbox
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(limits.shm_bytes),
        "--tmpfs",
        "/dev/shm",  # noqa: S108 - a fresh tmpfs inside the sandbox
        "--remount-ro",
        "/dev",
        # The root (with /etc) is a tmpfs bwrap built; nothing there may change afterwards.
        "--remount-ro",
        "/",
        "--chdir",
        WORKSPACE,
    ]
    argv = [
        toolchain.bwrap,
        "--args",
        str(options_fd),
        "--",
        toolchain.prlimit,
        *limits.interpreter_prlimit_arguments(),
        "--",
        *program,
    ]
    encoded = b"".join(option.encode() + b"\0" for option in options)
    return JailCommand(argv, encoded, (PASSWD.encode(), GROUP.encode()))


__all__ = [
    "BWRAP_ENVIRONMENT",
    "SANDBOX_GID",
    "SANDBOX_UID",
    "WORKSPACE",
    "JailCommand",
    "Limits",
    "Toolchain",
    "bwrap_command",
    "check_reachable",
]
