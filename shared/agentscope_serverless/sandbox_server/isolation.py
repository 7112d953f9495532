"""How a sandbox process is confined: the bubblewrap command line and the resource limits.

Each sandbox process runs under ``bwrap`` in new user, PID, network, IPC, UTS and cgroup
namespaces, with every capability dropped and no way to make user namespaces of its own,
as uid 65534 inside and a host uid of its own outside (so that no kernel quota counted per
user, such as inotify instances or keys, is shared between sandboxes), seeing only read-only
system directories, its own workspace (read-write) at ``/workspace``, a private ``/tmp``,
``/proc`` and ``/dev``. The program is PID 1 of its PID namespace (no process of bwrap's,
which the sandbox could take over, stays beside it), and ``prlimit`` sets the resource
limits right before it runs. ``prlimit`` runs *inside* the new user namespace on purpose:
the kernel counts processes (``RLIMIT_NPROC``) per user namespace, so each sandbox gets its
own process budget, and a fork bomb in one sandbox cannot starve the others.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agentscope_serverless.errors import ConfigurationError

# The user and group of a sandbox's processes inside it.
SANDBOX_UID = 65534
SANDBOX_GID = 65534
# Outside, the host uid (and gid, the same number) of the first sandbox; each has its own.
# In the range systemd leaves unused (past its containers' 524288-1879048191, below 2^31),
# far above the ranges useradd gives users in /etc/subuid (100000 on, 65536 each).
FIRST_HOST_UID = 1_879_048_192
MAX_HOST_UID = 2**32 - 2
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


class HostUids:
    """The host uids sandboxes run as (their gids are the same numbers): ``count`` of them
    from ``first`` on, one per sandbox, given back when it is released.

    >>> uids = HostUids(100000, 2)
    >>> uids.take(), uids.take()
    (100000, 100001)
    >>> uids.give_back(100000)
    >>> uids.take()
    100000
    """

    def __init__(self, first: int, count: int) -> None:
        self.first = first
        self.count = count
        self._taken: set[int] = set()

    @property
    def all(self) -> range:
        """Every uid of the range."""
        return range(self.first, self.first + self.count)

    def take(self) -> int:
        """The lowest uid no sandbox holds (the server's capacity keeps one free)."""
        for uid in self.all:
            if uid not in self._taken:
                self._taken.add(uid)
                return uid
        raise RuntimeError("every sandbox uid is in use")

    def give_back(self, uid: int) -> None:
        """``uid`` may serve another sandbox (its processes and files are gone)."""
        self._taken.discard(uid)


def check_free_uids(uids: range) -> None:
    """Fail clearly when a number of ``uids`` is a host user's or group's, or lies in a range
    ``/etc/subuid`` or ``/etc/subgid`` gives someone: a sandbox shares its uid with nobody."""
    if uids.start < 1 or uids.stop - 1 > MAX_HOST_UID:
        raise ConfigurationError(
            f"sandbox uids {uids.start}-{uids.stop - 1} are not between 1 and {MAX_HOST_UID}"
        )
    taken: list[str] = []
    for number in uids:
        for kind, lookup in (("user", pwd.getpwuid), ("group", grp.getgrgid)):
            with contextlib.suppress(KeyError):
                taken.append(f"{kind} {lookup(number)[0]} ({number})")
    for path in (Path("/etc/subuid"), Path("/etc/subgid")):
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(":")
            if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                start, size = int(fields[1]), int(fields[2])
                if start < uids.stop and uids.start < start + size:
                    taken.append(f"{fields[0]}'s range in {path}")
    if taken:
        raise ConfigurationError(
            f"sandboxes would run as host uids {uids.start}-{uids.stop - 1}, but "
            f"{', '.join(taken[:3])} use some of them; choose others with --first-sandbox-uid"
        )


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
# The only environment of bwrap itself (it starts PID 1 of the sandbox, whose environ is
# readable there, with the options' variables alone).
BWRAP_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class JailCommand:
    """How to start a confined program: ``argv``, plus the files bwrap reads from inherited
    descriptors (its options and the small files it writes inside), so that no host path
    appears in the command line the sandbox can read in ``/proc/1/cmdline``."""

    argv: list[str]
    options: bytes
    # What bwrap reads from the descriptors after the options' (at most JAIL_FDS - 1).
    files: tuple[bytes, ...]


# The descriptors bwrap reads from, at most: its options, /etc/passwd, /etc/group and the
# system call filter.
JAIL_FDS = 4


def bwrap_command(
    toolchain: Toolchain,
    limits: Limits,
    workspace: Path,
    program: list[str],
    fds: tuple[int, ...] = (3, 4, 5, 6),
    *,
    disable_userns: bool = True,
    syscall_filter: bytes | None = None,
    environment: Mapping[str, str] | None = None,
) -> JailCommand:
    """The command running ``program`` confined, with ``workspace`` as its files and
    ``environment`` set besides the jail's own variables.

    bwrap reads its options (the environment among them: a command line is every host
    user's to read), ``/etc/passwd``, ``/etc/group`` and the ``syscall_filter`` (a seccomp
    BPF program, see :mod:`.syscalls`) from the descriptors ``fds`` (:data:`JAIL_FDS`).
    With ``disable_userns`` (bubblewrap 0.8.0 or later) the sandbox cannot make user
    namespaces, in which it would hold every capability over new mounts and namespaces.
    """
    options_fd, passwd_fd, group_fd, filter_fd = fds
    options = [
        "--unshare-all",
        "--unshare-user",
        *(["--disable-userns"] if disable_userns else []),
        "--cap-drop",
        "ALL",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--die-with-parent",
        # The program is PID 1 (and reaps as the agent's parent, see agent.reap_as_init), not
        # bwrap's reaper: that would run without the limits, be spared by the agent's kill of
        # every other process after a call, and be the sandbox's to ptrace (same uid) and
        # make run code of its choosing.
        "--as-pid-1",
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
    for name, value in (environment or {}).items():
        options += ["--setenv", name, value]
    files = [PASSWD.encode(), GROUP.encode()]
    if syscall_filter is not None:
        options += ["--seccomp", str(filter_fd)]
        files.append(syscall_filter)
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
    return JailCommand(argv, encoded, tuple(files))


__all__ = [
    "BWRAP_ENVIRONMENT",
    "FIRST_HOST_UID",
    "JAIL_FDS",
    "SANDBOX_GID",
    "SANDBOX_UID",
    "WORKSPACE",
    "HostUids",
    "JailCommand",
    "Limits",
    "Toolchain",
    "bwrap_command",
    "check_free_uids",
    "check_reachable",
]
