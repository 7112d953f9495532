"""Kernel-enforced totals of a sandbox: a control group for its processes, a capped workspace.

Per-process limits (``prlimit``) bound one process; these bound the sandbox as a whole:

- ``memory``: one memory cgroup holds every process of the sandbox and the pages of its
  tmpfs mounts (``/tmp``, ``/dev/shm``), so N processes x M bytes cannot add up past the total;
- ``processes``: a pids cgroup caps the number of tasks (threads included) together;
- ``cpu``: a CPU quota (in CPUs) for the sandbox together;
- ``freeze``: between calls the freezer cgroup stops every process of the sandbox;
- ``workspace disk``: the workspace is its own ext4 file system in a sparse image file of
  the configured size, loop-mounted, so writes stop with ``ENOSPC`` at the cap.

Two more bounds are bubblewrap's: ``no nested user namespaces`` (``--disable-userns``, in
bubblewrap 0.8.0 or later) keeps the sandbox's code from making a user namespace, in which
it would hold every capability over new mounts and namespaces: kernel surface it never needs;
the ``system call filter`` (``--seccomp``, see :mod:`.syscalls`) refuses the system calls it
never needs before the kernel looks at them.

Control groups v2 (a unified hierarchy at ``/sys/fs/cgroup``) and v1 (one hierarchy per
controller) are both supported; :func:`probe` finds out what this host lets the server do.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentscope_serverless.sandbox_server.syscalls import (
    SyscallFilterUnavailableError,
    filter_program,
)

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
MEMORY = "memory"
PROCESSES = "processes"
CPU = "cpu"
FREEZE = "freeze"
DISK = "workspace disk"
NO_USERNS = "no nested user namespaces"
SYSCALLS = "system call filter"
BOUNDS = (MEMORY, PROCESSES, CPU, FREEZE, DISK, NO_USERNS, SYSCALLS)
V1_CONTROLLERS = {MEMORY: "memory", PROCESSES: "pids", CPU: "cpu", FREEZE: "freezer"}
V2_CONTROLLERS = {MEMORY: "memory", PROCESSES: "pids", CPU: "cpu"}
CPU_PERIOD_US = 100_000
KILL_TIMEOUT_SECONDS = 2.0
MiB = 1024**2
HOST_CPUS = os.cpu_count() or 1
# What the kernel's OOM killer adds to the badness of a sandbox's processes (the most: they
# go first) and of the server's, run as root (low: it goes after them, and any other).
SANDBOX_OOM_SCORE_ADJ = 1000
SERVER_OOM_SCORE_ADJ = -500
# A workspace image holds the sandbox's files, readable in it by anyone who may read it.
IMAGE_MODE = 0o600


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _own_cgroup(version: int, controller: str = "") -> str | None:
    """This process's cgroup path in the v2 hierarchy or the v1 ``controller`` hierarchy."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        number, controllers, path = line.split(":", 2)
        if version == 2 and number == "0" and controllers == "":
            return path
        if version == 1 and controller in controllers.split(","):
            return path
    return None


def host_memory() -> int:
    """The memory this server and its sandboxes can have, in bytes: the host's (``MemTotal``
    of ``/proc/meminfo``), or the memory limit of the server's own cgroup or one above it
    when lower (a server in a container, or in a memory-limited service)."""
    total = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    limits = [total] if total else []
    for group, limit_file in _own_memory_groups():
        while True:
            with contextlib.suppress(OSError, ValueError):
                limits.append(int((group / limit_file).read_text().strip()))  # "max": none
            if group in (CGROUP_ROOT, CGROUP_ROOT / "memory"):
                break
            group = group.parent
    if not limits:
        raise OSError("cannot tell the host's memory: /proc/meminfo has no MemTotal")
    return min(limits)


def _own_memory_groups() -> list[tuple[Path, str]]:
    """This process's memory cgroup (v2 and v1) and the file holding its limit."""
    groups = []
    own = _own_cgroup(2)
    if own is not None and (CGROUP_ROOT / "cgroup.controllers").exists():
        groups.append((CGROUP_ROOT / own.lstrip("/"), "memory.max"))
    own = _own_cgroup(1, "memory")
    if own is not None and (CGROUP_ROOT / "memory").is_dir():
        groups.append((CGROUP_ROOT / "memory" / own.lstrip("/"), "memory.limit_in_bytes"))
    return groups


def spare_from_oom_killer() -> None:
    """Make the kernel's OOM killer choose this process after the others (sandboxes, see
    :data:`SANDBOX_OOM_SCORE_ADJ`, first). Lowering a score needs ``CAP_SYS_RESOURCE``
    (root, in most containers): without it the process keeps the score it has."""
    with contextlib.suppress(OSError):
        _write(Path("/proc/self/oom_score_adj"), str(SERVER_OOM_SCORE_ADJ))


def remove_tree(directory: Path) -> None:
    """Delete ``directory`` and all it holds (errors ignored), however deeply a sandbox
    nested directories in it, and whatever permissions it left on them: ``shutil.rmtree``
    recurses once per level and stops at Python's recursion limit, ``rm`` does not; and a
    server that is not root cannot delete from a folder the sandbox (its own user) made
    read-only, until it makes it writable again (``chmod -R`` follows no link)."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(directory, ignore_errors=True)
    if not os.path.lexists(directory):
        return
    for command in (["chmod", "-R", "u+rwx", "--"], ["rm", "-rf", "--"]):
        subprocess.run(
            [*command, str(directory)],
            capture_output=True,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )


def remove_stale_groups(directory: Path) -> None:
    """Remove the groups left under ``directory`` by servers that died (killed, crashed):
    whatever still runs in them is killed first."""
    for parent in directory.glob("agentscope-sandbox-*"):
        pid = parent.name.removeprefix("agentscope-sandbox-").removesuffix("-server")
        if not pid.isdigit() or Path(f"/proc/{pid}").exists() or not parent.is_dir():
            continue
        children = [child for child in parent.iterdir() if child.is_dir()]
        for child in children:
            version = 2 if (child / "cgroup.controllers").exists() else 1
            freezer = child if (child / "freezer.state").exists() or version == 2 else None
            SandboxCgroup(version, {"group": child}, freezer).remove()
        with contextlib.suppress(OSError):
            parent.rmdir()
        logger.info("removed the cgroups of a server that is gone (%s)", parent.name)


def remove_leftovers(root: Path) -> None:
    """Remove what a server on ``root`` left when it was killed before its own clean-up,
    once it is gone: its sandboxes' workspaces (unmounted: their disk freed) and, with those
    of any server that is gone, its control groups (they sit in this process's groups)."""
    tools = DiskTools.find()
    with contextlib.suppress(OSError):
        for directory in (root / "sandboxes").iterdir():
            if tools is not None:
                with contextlib.suppress(OSError):
                    remove_workspace(tools, directory)
            remove_tree(directory)
    if os.geteuid() != 0:
        return
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        own = _own_cgroup(2)
        bases = [CGROUP_ROOT / own.lstrip("/")] if own is not None else []
    else:
        bases = _v1_bases()
    for base in bases:
        with contextlib.suppress(OSError):
            remove_stale_groups(base)


def _v1_bases() -> list[Path]:
    """This process's group in each v1 hierarchy a server uses, the freezer's first: the
    frozen tasks of a server that is gone die only once thawed, and until then hold the
    groups of the other hierarchies."""
    bases = []
    for controller in sorted(V1_CONTROLLERS.values(), key=lambda name: name != "freezer"):
        own = _own_cgroup(1, controller)
        if own is not None and (CGROUP_ROOT / controller / "cgroup.procs").exists():
            bases.append(CGROUP_ROOT / controller / own.lstrip("/"))
    return bases


class Cgroups:
    """The control groups of this server: one parent, one child per sandbox."""

    version: int = 0
    bounds: frozenset[str] = frozenset()

    def create(self, name: str, *, memory: int, processes: int, cpus: float) -> SandboxCgroup:
        raise NotImplementedError

    def remove_parent(self) -> None:
        """Remove the server's parent groups (once every sandbox is gone)."""


@dataclass
class SandboxCgroup:
    """The cgroup directories of one sandbox (one per v1 hierarchy, or the single v2 one)."""

    version: int
    directories: dict[str, Path]
    freezer: Path | None
    frozen: bool = field(default=False)

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a new process writes its pid to, to join the sandbox."""
        return [str(d / "cgroup.procs") for d in dict.fromkeys(self.directories.values())]

    def pids(self) -> set[int]:
        """Every process of the sandbox."""
        found: set[int] = set()
        for directory in set(self.directories.values()):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return found

    def freeze(self) -> None:
        """Stop every process of the sandbox (they use no CPU until :meth:`thaw`)."""
        if self.freezer is None or self.frozen:
            return
        if self.version == 2:
            _write(self.freezer / "cgroup.freeze", "1")
        else:
            _write(self.freezer / "freezer.state", "FROZEN")
        self.frozen = True

    def thaw(self) -> None:
        """Let the sandbox's processes run again."""
        if self.freezer is None or not self.frozen:
            return
        if self.version == 2:
            _write(self.freezer / "cgroup.freeze", "0")
        else:
            _write(self.freezer / "freezer.state", "THAWED")
        self.frozen = False

    def kill_all(self) -> bool:
        """SIGKILL every process of the sandbox, including ones that left its process group
        or were re-parented; True once none is left (waits up to a few seconds)."""
        deadline = time.monotonic() + KILL_TIMEOUT_SECONDS
        killer = None if self.freezer is None else self.freezer / "cgroup.kill"
        while True:
            pids = self.pids()
            if not pids:
                return True
            if killer is not None and self.version == 2 and killer.exists():
                with contextlib.suppress(OSError):
                    _write(killer, "1")
            else:
                # Frozen first so nothing forks between the listing and the kill.
                with contextlib.suppress(OSError):
                    self.frozen = False
                    self.freeze()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            # A frozen task dies only once thawed.
            with contextlib.suppress(OSError):
                self.frozen = True
                self.thaw()
            if time.monotonic() > deadline:
                logger.error("processes %s of a sandbox survived SIGKILL", sorted(pids))
                return False
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and remove the directories."""
        self.kill_all()
        for directory in dict.fromkeys(self.directories.values()):
            for _ in range(200):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        logger.error("cannot remove cgroup %s: %s", directory.name, exc)
                        break
                    time.sleep(0.01)


class CgroupsV1(Cgroups):
    """One hierarchy per controller (``/sys/fs/cgroup/memory``, ``pids``, ``cpu``, ``freezer``)."""

    version = 1

    def __init__(self, parents: dict[str, Path]) -> None:
        self.parents = parents
        self.bounds = frozenset(parents)

    @classmethod
    def setup(cls, name: str) -> CgroupsV1:
        for base in _v1_bases():
            with contextlib.suppress(OSError):
                remove_stale_groups(base)
        parents: dict[str, Path] = {}
        for bound, controller in V1_CONTROLLERS.items():
            hierarchy = CGROUP_ROOT / controller
            own = _own_cgroup(1, controller)
            if own is None or not (hierarchy / "cgroup.procs").exists():
                continue
            parent = hierarchy / own.lstrip("/") / name
            try:
                parent.mkdir(exist_ok=True)
                if controller == "memory":
                    with contextlib.suppress(OSError):
                        _write(parent / "memory.use_hierarchy", "1")
                if controller == "cpu":
                    # All sandboxes together weigh as much as a busy task per host CPU.
                    with contextlib.suppress(OSError):
                        _write(parent / "cpu.shares", str(1024 * HOST_CPUS))
            except OSError as exc:
                logger.info("no %s cgroup: %s", controller, exc)
                continue
            parents[bound] = parent
        return cls(parents)

    def create(self, name: str, *, memory: int, processes: int, cpus: float) -> SandboxCgroup:
        directories: dict[str, Path] = {}
        try:
            for bound, parent in self.parents.items():
                directory = parent / name
                directory.mkdir()
                directories[bound] = directory
                if bound == MEMORY:
                    _write(directory / "memory.limit_in_bytes", str(memory))
                    swap = directory / "memory.memsw.limit_in_bytes"
                    if swap.exists():
                        with contextlib.suppress(OSError):
                            _write(swap, str(memory))
                elif bound == PROCESSES:
                    _write(directory / "pids.max", str(processes))
                elif bound == CPU:
                    _write(directory / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                    _write(directory / "cpu.cfs_quota_us", str(round(cpus * CPU_PERIOD_US)))
        except OSError:
            SandboxCgroup(1, directories, None).remove()
            raise
        return SandboxCgroup(1, directories, directories.get(FREEZE))

    def remove_parent(self) -> None:
        for parent in self.parents.values():
            with contextlib.suppress(OSError):
                parent.rmdir()


class CgroupsV2(Cgroups):
    """The unified hierarchy: the server moves itself into a leaf so that its own group may
    hand the memory, pids and cpu controllers down to one child group per sandbox."""

    version = 2

    def __init__(self, parent: Path | None, bounds: frozenset[str]) -> None:
        self.parent = parent
        self.bounds = bounds

    @classmethod
    def setup(cls, name: str) -> CgroupsV2:
        own = _own_cgroup(2)
        if own is None:
            return cls(None, frozenset())
        base = CGROUP_ROOT / own.lstrip("/")
        with contextlib.suppress(OSError):
            remove_stale_groups(base)
        try:
            available = set((base / "cgroup.controllers").read_text().split())
            parent = base / name
            parent.mkdir(exist_ok=True)
            if base != CGROUP_ROOT:
                # No process may stay in a group that hands controllers down: move the server.
                leaf = base / f"{name}-server"
                leaf.mkdir(exist_ok=True)
                _write(leaf / "cgroup.procs", str(os.getpid()))
            enable = " ".join(f"+{c}" for c in V2_CONTROLLERS.values() if c in available)
            if enable:
                _write(base / "cgroup.subtree_control", enable)
                _write(parent / "cgroup.subtree_control", enable)
            if "cpu" in available:
                with contextlib.suppress(OSError):
                    _write(parent / "cpu.weight", str(min(10000, 100 * HOST_CPUS)))
        except OSError as exc:
            logger.info("no delegated cgroup v2 hierarchy: %s", exc)
            return cls(None, frozenset())
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        bounds = {bound for bound, c in V2_CONTROLLERS.items() if c in enabled}
        bounds.add(FREEZE)  # cgroup.freeze is part of every v2 group
        return cls(parent, frozenset(bounds))

    def create(self, name: str, *, memory: int, processes: int, cpus: float) -> SandboxCgroup:
        assert self.parent is not None
        directory = self.parent / name
        directory.mkdir()
        group = SandboxCgroup(2, dict.fromkeys(self.bounds, directory), directory)
        try:
            if MEMORY in self.bounds:
                _write(directory / "memory.max", str(memory))
                with contextlib.suppress(OSError):
                    _write(directory / "memory.swap.max", "0")
            if PROCESSES in self.bounds:
                _write(directory / "pids.max", str(processes))
            if CPU in self.bounds:
                _write(directory / "cpu.max", f"{round(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
        except OSError:
            group.remove()
            raise
        return group

    def remove_parent(self) -> None:
        if self.parent is not None:
            with contextlib.suppress(OSError):
                self.parent.rmdir()


def setup_cgroups(name: str) -> Cgroups:
    """This host's cgroups for the server (empty when it may not manage any)."""
    if os.geteuid() != 0:
        return Cgroups()
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return CgroupsV2.setup(name)
    if (CGROUP_ROOT / "memory").is_dir():
        return CgroupsV1.setup(name)
    return Cgroups()


@dataclass(frozen=True)
class DiskTools:
    """The host programs that make a size-capped workspace file system."""

    mkfs: str
    mount: str
    umount: str
    cp: str

    @classmethod
    def find(cls) -> DiskTools | None:
        """The tools, when this process may loop-mount file systems (root, loop devices)."""
        mkfs, mount, umount, cp = (shutil.which(n) for n in ("mkfs.ext4", "mount", "umount", "cp"))
        if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
            return None
        if mkfs is None or mount is None or umount is None or cp is None:
            return None
        return cls(mkfs, mount, umount, cp)


def make_template(tools: DiskTools, image: Path, size: int) -> Path:
    """An empty ext4 file system image of ``size`` bytes whose root this process owns (mode
    700), which :func:`make_workspace` copies for each sandbox."""
    image.parent.mkdir(parents=True, exist_ok=True)
    with open(os.open(image, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, IMAGE_MODE), "wb") as handle:
        os.fchmod(handle.fileno(), IMAGE_MODE)  # made before, under another mode
        handle.truncate(size)  # sparse: host disk is used only as the sandbox writes
    uid, gid = os.geteuid(), os.getegid()
    _run(
        tools.mkfs,
        "-q",
        "-F",
        "-m",
        "0",
        "-O",
        "^has_journal",
        "-E",
        f"root_owner={uid}:{gid},lazy_itable_init=1,nodiscard",
        str(image),
    )
    mounted = image.with_suffix(".mnt")
    mounted.mkdir(exist_ok=True)
    _run(tools.mount, "-o", "loop,nosuid,nodev", str(image), str(mounted))
    try:
        with contextlib.suppress(OSError):
            (mounted / "lost+found").rmdir()
        mounted.chmod(0o700)
    finally:
        _run(tools.umount, str(mounted))
        mounted.rmdir()
    return image


def make_workspace(tools: DiskTools, directory: Path, template: Path) -> Path:
    """A workspace at ``directory/workspace``: a fresh copy of the ``template`` file system."""
    image = directory / "workspace.img"
    workspace = directory / "workspace"
    workspace.mkdir(mode=0o700)
    _run(tools.cp, "--sparse=always", str(template), str(image))
    # Before /proc/mounts names it to every host user.
    image.chmod(IMAGE_MODE)
    _run(tools.mount, "-o", "loop,nosuid,nodev", str(image), str(workspace))
    return workspace


def workspace_room(sandboxes: Path, size: int) -> tuple[int, int]:
    """The bytes free on the file system holding ``sandboxes``, and the bytes its workspaces
    may still take with one more: a workspace image is sparse and grows as its sandbox writes,
    up to ``size``, so each may still take ``size`` less what it holds already.

    A sandbox filling its workspace must find its cap, not a full host disk: another
    workspace is made only while the disk has room for every one of them to fill up.
    """
    stats = os.statvfs(sandboxes)
    free = stats.f_bavail * stats.f_frsize
    needed = size
    for image in sandboxes.glob("*/workspace.img"):
        with contextlib.suppress(OSError):  # released meanwhile
            needed += max(0, size - image.stat().st_blocks * 512)
    return free, needed


def remove_workspace(tools: DiskTools, directory: Path) -> None:
    """Unmount the workspace file system (its loop device goes with it) and delete it all."""
    workspace = directory / "workspace"
    if os.path.ismount(workspace):
        try:
            _run(tools.umount, str(workspace))
        except OSError:
            # Busy (a process of the sandbox still exiting): detach now, freed when unused.
            _run(tools.umount, "-l", str(workspace))
    remove_tree(directory)


def _run(*command: str) -> None:
    result = subprocess.run(
        command, capture_output=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, check=False
    )
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip()
        raise OSError(f"{Path(command[0]).name} failed: {message}")


def probe_disk(tools: DiskTools | None, scratch: Path) -> bool:
    """True when a capped workspace can actually be made here (tried once at start)."""
    if tools is None:
        return False
    directory = scratch / "probe-disk"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    try:
        make_workspace(tools, directory, make_template(tools, directory / "t.img", 8 * MiB))
    except OSError as exc:
        logger.info("no size-capped workspaces: %s", exc)
        return False
    finally:
        with contextlib.suppress(OSError):
            remove_workspace(tools, directory)
    return True


def bwrap_disables_userns(bwrap: str | None) -> bool:
    """True when ``bwrap`` can keep a sandbox from making user namespaces on this host
    (``--disable-userns``, which bubblewrap before 0.8.0 does not know): tried once at start."""
    if bwrap is None:
        return False
    try:
        done = subprocess.run(
            [bwrap, "--unshare-user", "--disable-userns", "--ro-bind", "/", "/", "/bin/true"],
            capture_output=True,
            env={"PATH": "/usr/bin:/bin"},
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("bwrap cannot disable user namespaces: %s", exc)
        return False
    if done.returncode != 0:
        logger.info(
            "bwrap cannot disable user namespaces: %s", done.stderr.decode(errors="replace").strip()
        )
    return done.returncode == 0


def bwrap_filters_syscalls(bwrap: str | None) -> bytes | None:
    """The system call filter (see :mod:`.syscalls`), when libseccomp is installed and
    ``bwrap`` can install the filter on this host: tried once at start."""
    if bwrap is None:
        return None
    try:
        program = filter_program()
    except SyscallFilterUnavailableError as exc:
        logger.info("no system call filter: %s", exc)
        return None
    reader, writer = os.pipe()
    with os.fdopen(writer, "wb") as stream:
        stream.write(program)  # a few hundred bytes: the pipe holds them
    try:
        done = subprocess.run(
            [bwrap, "--unshare-user", "--seccomp", str(reader), "--ro-bind", "/", "/", "/bin/true"],
            capture_output=True,
            env={"PATH": "/usr/bin:/bin"},
            pass_fds=(reader,),
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("bwrap cannot filter system calls: %s", exc)
        return None
    finally:
        os.close(reader)
    if done.returncode != 0:
        logger.info(
            "bwrap cannot filter system calls: %s", done.stderr.decode(errors="replace").strip()
        )
        return None
    return program


def how_to_enforce(missing: list[str]) -> str:
    """What would let this host enforce the ``missing`` bounds."""
    ways = []
    if set(missing) - {NO_USERNS, SYSCALLS}:
        ways.append("run as root with cgroups and loop devices, or turn those bounds off")
    if NO_USERNS in missing:
        ways.append("install bubblewrap 0.8.0 or later")
    if SYSCALLS in missing:
        ways.append("install libseccomp (Debian: apt-get install libseccomp2)")
    return "; ".join(ways)


__all__ = [
    "BOUNDS",
    "CPU",
    "DISK",
    "FREEZE",
    "MEMORY",
    "NO_USERNS",
    "PROCESSES",
    "SANDBOX_OOM_SCORE_ADJ",
    "SERVER_OOM_SCORE_ADJ",
    "SYSCALLS",
    "Cgroups",
    "DiskTools",
    "SandboxCgroup",
    "bwrap_disables_userns",
    "bwrap_filters_syscalls",
    "host_memory",
    "how_to_enforce",
    "make_template",
    "make_workspace",
    "probe_disk",
    "remove_leftovers",
    "remove_tree",
    "remove_workspace",
    "setup_cgroups",
    "spare_from_oom_killer",
]


@dataclass
class HostIsolation:
    """What this host lets the server enforce, found once at start (:meth:`probe`)."""

    cgroups: Cgroups
    disk: DiskTools | None
    setpriv: str | None
    disables_userns: bool = False
    # The system call filter bwrap installs (None: none can be here).
    syscall_filter: bytes | None = None

    @classmethod
    def probe(cls, scratch: Path) -> HostIsolation:
        """Set up this server's cgroups, try a capped workspace under ``scratch`` and bwrap's
        ``--disable-userns`` and ``--seccomp``."""
        disables_userns = bwrap_disables_userns(shutil.which("bwrap"))
        syscall_filter = bwrap_filters_syscalls(shutil.which("bwrap"))
        cgroups = setup_cgroups(f"agentscope-sandbox-{os.getpid()}")
        disk = DiskTools.find()
        if not probe_disk(disk, scratch):
            disk = None
        setpriv = shutil.which("setpriv") if os.geteuid() == 0 else None
        if setpriv is None and cgroups.bounds:
            # Joining a cgroup happens as root before dropping to the sandbox uid.
            cgroups = Cgroups()
        return cls(cgroups, disk, setpriv, disables_userns, syscall_filter)

    @property
    def enforced(self) -> list[str]:
        """The bounds this server enforces, in :data:`BOUNDS` order."""
        have = set(self.cgroups.bounds) | ({DISK} if self.disk is not None else set())
        have |= {NO_USERNS} if self.disables_userns else set()
        have |= {SYSCALLS} if self.syscall_filter is not None else set()
        return [bound for bound in BOUNDS if bound in have]

    def missing(self, configured: list[str]) -> list[str]:
        """The ``configured`` bounds this server cannot enforce."""
        return [bound for bound in configured if bound not in self.enforced]

    def close(self) -> None:
        """Remove the server's parent cgroups."""
        self.cgroups.remove_parent()


__all__ += ["HostIsolation"]
