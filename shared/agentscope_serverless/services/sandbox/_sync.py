"""Run coroutines from synchronous code, even when the caller already runs an event loop.

The seeds call ``SandboxService.connect`` synchronously from notebook cells with top-level
``await``, where ``asyncio.run`` is not allowed. Every synchronous call therefore runs on one
private event loop in a helper thread, whether or not the calling thread has a loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """An event loop on a daemon thread, started on first use.

    >>> async def answer() -> int:
    ...     return 42
    >>> loop = BackgroundLoop("demo")
    >>> loop.run(answer())
    42
    >>> loop.close()
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the helper loop and wait for its result in this thread."""
        loop = self._started()
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a synchronous sandbox call cannot wait on its own helper loop")
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def close(self, last: Coroutine[Any, Any, Any] | None = None) -> None:
        """Run ``last`` (if any) on the loop, then stop the loop and its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            if last is not None:
                last.close()
            return
        try:
            if last is not None:
                asyncio.run_coroutine_threadsafe(last, loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The helper loop, when it runs."""
        return self._loop

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop


__all__ = ["BackgroundLoop"]
