"""Start a program as a terminal would, for tests that signal it."""

from __future__ import annotations

import signal

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def terminal_signals() -> None:
    """``preexec_fn`` of a program a test stops with SIGINT or SIGTERM: both at their default
    and unblocked, as in a shell, whatever the test process inherited or set (a signal its
    parent ignores or blocks, the child would ignore too)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
