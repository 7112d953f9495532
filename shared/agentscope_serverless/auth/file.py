"""Keys in a JSON file: for a local server, managed with the ``agentscope-serverless keys`` CLI.

The file holds only hashes. It is replaced atomically (write to a temporary file, fsync,
rename) with 0600 permissions, and changes are serialised across processes with an
advisory lock, so the CLI can create or revoke keys while a server is running: the server
sees a revoke within ``check_seconds`` (one second by default), and a key created a moment
ago at once. A request with a known key makes no filesystem call: the file's identity is
checked at most once per ``check_seconds``, and it is re-read only when it changed on disk;
a key not found has it checked again at once (one ``stat``, no read unless it changed).
A file that cannot be read (a hand edit breaking its JSON) is remembered as long: requests
meanwhile get the same 503, and the failure is logged at most once per ``check_seconds``,
whatever the number of requests. Only a regular file (or a symlink to one) is read, and
only up to :data:`MAX_FILE_BYTES`: a named pipe would block the server's read, and a file
of hundreds of megabytes (a path set by mistake) would be read whole each time it changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.auth.keys import KeyRecord
from agentscope_serverless.errors import StoreUnavailableError
from agentscope_serverless.log import logger

FILE_VERSION = 1
# A key's record takes about 220 bytes of the file (6.5 KB with the longest user id): 16 MiB
# holds some 75,000 keys, far more than a key file is for.
MAX_FILE_BYTES = 16 * 2**20


_TOO_LARGE = (
    f"it is larger than {MAX_FILE_BYTES // 2**20} MiB, far more than any number of keys takes "
    "(is the path the key file's?)"
)


class _RefusedFile(Exception):
    """The key file is not one to read: the message says why."""


class FileKeyStore(KeyStore):
    """Key records in a JSON file at ``path`` (created on the first key).

    >>> store = FileKeyStore("/tmp/example-keys.json")
    """

    def __init__(self, path: str | Path, *, check_seconds: float = 1.0) -> None:
        self.path = Path(path).expanduser()
        self.check_seconds = check_seconds
        self._records: dict[str, KeyRecord] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._checked_at: float | None = None
        # Why the file could not be read, when it could not at its last read.
        self._failure: str | None = None

    async def health(self) -> bool:
        if not self._started:
            return False
        try:
            self._checked()
        except StoreUnavailableError:
            return False
        return True

    async def _get(self, key_id: str) -> KeyRecord | None:
        record = self._checked().get(key_id)
        if record is None and self._failure is None:
            # A key the CLI created since the last check works at once.
            self._checked_at = time.monotonic()
            record = self._load().get(key_id)
        return record

    def _checked(self) -> dict[str, KeyRecord]:
        """The records, the file checked at most once per ``check_seconds``: a failed read
        is kept as long as a good one (re-read, and logged, no more often)."""
        now = time.monotonic()
        if self._checked_at is None or now - self._checked_at >= self.check_seconds:
            self._checked_at = now
            self._failure = None
            self._load()
        if self._failure is not None:
            raise StoreUnavailableError("key file", self._failure)
        return self._records

    async def _put(self, record: KeyRecord) -> None:
        def add(records: dict[str, KeyRecord]) -> KeyRecord:
            records[record.key_id] = record
            return record

        await asyncio.to_thread(self._update, add)

    async def _revoke(self, key_id: str) -> KeyRecord | None:
        def revoke(records: dict[str, KeyRecord]) -> KeyRecord | None:
            record = records.get(key_id)
            if record is not None:
                record = records[key_id] = record.model_copy(update={"revoked": True})
            return record

        return await asyncio.to_thread(self._update, revoke)

    async def _list(self) -> list[KeyRecord]:
        return list(self._load().values())

    def _load(self) -> dict[str, KeyRecord]:
        """The records on disk, re-read only when the file changed since the last read."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._records, self._stamp = {}, None
            return self._records
        except OSError as exc:
            raise self._unavailable("it cannot be read", exc) from None
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if stamp != self._stamp:
            self._records = self._read()
            self._stamp = stamp
        return self._records

    def _read(self) -> dict[str, KeyRecord]:
        try:
            data = json.loads(self._content())
            records = [KeyRecord.model_validate(item) for item in data["keys"]]
        except _RefusedFile as refused:
            raise self._unavailable(str(refused), refused) from None
        except (OSError, ValueError, KeyError, TypeError, RecursionError, ValidationError) as exc:
            raise self._unavailable("it is not a readable key file", exc) from None
        return {record.key_id: record for record in records}

    def _content(self) -> bytes:
        """The file's bytes, when it is a regular file of at most :data:`MAX_FILE_BYTES`.

        Opened without blocking and checked on what was opened: a named pipe (its open, then
        its read, wait for a writer that may never come) or a device is refused, whatever
        the path was a moment before.
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _RefusedFile("it is not a regular file")
            if info.st_size > MAX_FILE_BYTES:
                raise _RefusedFile(_TOO_LARGE)
            with os.fdopen(fd, "rb", closefd=False) as handle:
                content = handle.read(MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
        if len(content) > MAX_FILE_BYTES:  # it grew since
            raise _RefusedFile(_TOO_LARGE)
        return content

    def _unavailable(self, failure: str, exc: Exception) -> StoreUnavailableError:
        # The answer a caller gets says what failed, never where the file lives; the log
        # line, for whoever runs the server, says both.
        self._failure = failure
        logger.warning(
            "key file unreadable",
            extra={"path": str(self.path), "error": f"{type(exc).__name__}: {exc}"[:500]},
        )
        return StoreUnavailableError("key file", failure)

    def _update(
        self, change: Callable[[dict[str, KeyRecord]], KeyRecord | None]
    ) -> KeyRecord | None:
        """Apply ``change`` to the records and write them back, under an exclusive lock."""
        # Written where a symlink leads, which stays one: replaced by a file of its own, a
        # key revoked through it would still work on a server reading the file it named.
        target = Path(os.path.realpath(self.path))
        try:
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            lock_fd = os.open(f"{target}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise self._unwritable(exc) from None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            self._stamp = self._checked_at = None
            records = dict(self._load())
            result = change(records)
            try:
                self._write(records, target)
            except OSError as exc:
                raise self._unwritable(exc) from None
            return result
        finally:
            os.close(lock_fd)

    def _unwritable(self, exc: OSError) -> StoreUnavailableError:
        # As _unavailable, but the records read stay good: a key is still authenticated.
        logger.warning(
            "key file unwritable",
            extra={"path": str(self.path), "error": f"{type(exc).__name__}: {exc}"[:500]},
        )
        return StoreUnavailableError("key file", "it cannot be written")

    @staticmethod
    def _write(records: dict[str, KeyRecord], target: Path) -> None:
        payload = json.dumps(
            {"version": FILE_VERSION, "keys": [r.model_dump() for r in records.values()]},
            indent=2,
        ).encode()
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".keys-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


__all__ = ["MAX_FILE_BYTES", "FileKeyStore"]
