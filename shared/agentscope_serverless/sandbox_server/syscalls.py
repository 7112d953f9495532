"""The system calls a sandbox's code may not make: a seccomp filter, installed by bwrap.

In its namespaces, with every capability dropped, a sandbox's code still reaches the whole
kernel through system calls: most of those it never needs answer ``EPERM`` for want of a
capability, but only after the kernel has parsed their arguments, and some need none
(``bpf``, ``userfaultfd``, ``io_uring_setup``, ``keyctl``, ``perf_event_open``): each is a way
into kernel code with a record of privilege escalations. The filter answers ``EPERM`` to the
calls of :data:`DENIED` before the kernel looks at them (about what Docker's default profile
denies a container), and kills a process that makes a system call of another architecture
(x32 or i386 numbers on x86-64), whose numbers the filter does not check.

The filter is made with libseccomp (the host's shared library, Debian's ``libseccomp2``,
through ``pyseccomp``), as the BPF program bwrap loads with ``--seccomp``.
"""

from __future__ import annotations

import errno
import tempfile

DENIED = (
    # Another process's memory and registers (the sandbox's PID 1 among them).
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    # Kernel subsystems a sandbox never needs, whose bugs are reached without privileges.
    "bpf",
    "userfaultfd",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "add_key",
    "request_key",
    "keyctl",
    # The kernel's log (addresses that help an exploit).
    "syslog",
    # Namespaces and mounts (refused for want of capabilities: refused first here).
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "open_by_handle_at",
    "name_to_handle_at",
    # The machine's own administration.
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "ioperm",
    "iopl",
    "uselib",
    "ustat",
    "sysfs",
    "lookup_dcookie",
    "vm86",
    "vm86old",
)


class SyscallFilterUnavailableError(RuntimeError):
    """libseccomp cannot be used here (not installed)."""


def filter_program() -> bytes:
    """The filter as the BPF program of bwrap's ``--seccomp``, for this machine's
    architecture (calls it does not have are left out).

    Raises :class:`SyscallFilterUnavailableError` when libseccomp is not installed.
    """
    try:
        import pyseccomp
    except (ImportError, RuntimeError) as exc:  # RuntimeError: no libseccomp library
        raise SyscallFilterUnavailableError(str(exc)) from None
    denied = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED:
        try:
            denied.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except OSError:  # a call libseccomp does not know (newer than it)
            continue
    with tempfile.TemporaryFile() as program:
        denied.export_bpf(program)
        program.seek(0)
        return program.read()


__all__ = ["DENIED", "SyscallFilterUnavailableError", "filter_program"]
