"""The key store interface, and the logic every backend shares (issue, verify, revoke).

>>> async def demo(store: KeyStore) -> None:
...     issued = await store.create_key(kind="user", user_id="alice")
...     principal = await store.authenticate(issued.key)
...     assert principal.user_id == "alice"
"""

from __future__ import annotations

import re
from abc import abstractmethod

from agentscope_serverless.auth.keys import (
    KEY_ID_PATTERN,
    IssuedKey,
    KeyKind,
    KeyRecord,
    Principal,
    hash_secret,
    new_key,
    parse_key,
    secret_matches,
)
from agentscope_serverless.errors import AuthenticationError, InvalidInputError, NotFoundError
from agentscope_serverless.services._validation import (
    require_unpadded_user_id,
    require_user_id,
    require_user_id_shown_as_written,
)
from agentscope_serverless.services.base import (
    ServiceWithLifecycleManager,
    StartedGuard,
    service_call,
)

# Compared against when the key id is unknown, so a miss costs the same as a wrong secret.
_DUMMY_HASH = hash_secret("no such key")


class KeyStore(StartedGuard, ServiceWithLifecycleManager):
    """API keys, stored hashed: create, list, revoke, and authenticate a presented key."""

    async def start(self) -> None:
        self._set_started(True)

    async def stop(self) -> None:
        self._set_started(False)

    async def health(self) -> bool:
        return self._started

    @service_call
    async def create_key(self, *, kind: KeyKind = "user", user_id: str | None = None) -> IssuedKey:
        """Issue a key. A user key needs ``user_id`` (one a service key could name too: no
        whitespace around it; and one shown as it is: no bidirectional control); a service
        key must not have one."""
        if kind == "user":
            user_id = require_unpadded_user_id(require_user_id(user_id))
            user_id = require_user_id_shown_as_written(user_id)
        elif kind == "service":
            if user_id is not None:
                raise InvalidInputError("a service key has no user", field="user_id")
        else:
            raise InvalidInputError("kind must be 'user' or 'service'", field="kind")
        key_id, secret, key = new_key()
        record = KeyRecord(key_id=key_id, key_hash=hash_secret(secret), kind=kind, user_id=user_id)
        await self._put(record)
        return IssuedKey(key=key, record=record)

    @service_call
    async def revoke_key(self, key_id: str) -> KeyRecord:
        """Revoke a key for good, given by its id or whole (``ask_<id>_<secret>``, as one
        pastes a key that leaked); revoking it again is not an error."""
        parsed = parse_key(key_id)
        if parsed is not None:
            key_id = parsed[0]
        elif not re.fullmatch(KEY_ID_PATTERN, key_id):
            # Not shown: it may be a key with a stray character, its secret in clear.
            raise InvalidInputError(
                "not a key id: give the 16 hex characters after ask_ (as keys list shows "
                "them), or the whole key as it was printed",
                field="key_id",
            )
        record = await self._revoke(key_id)
        if record is None:
            raise NotFoundError(f"no key with id {key_id!r}")
        return record

    @service_call
    async def list_keys(self) -> list[KeyRecord]:
        """Every key record (revoked ones too), oldest first."""
        return sorted(await self._list(), key=lambda r: (r.created_at, r.key_id))

    @service_call
    async def authenticate(self, key: str) -> Principal:
        """The principal of a valid, unrevoked key; :class:`AuthenticationError` otherwise."""
        parsed = parse_key(key)
        if parsed is None:
            # Not shown: it may be a real key with a stray character.
            raise AuthenticationError(
                "invalid API key: it is not of the form ask_<id>_<secret> (send the whole key "
                "as it was printed, without quotes, brackets or spaces)"
            )
        key_id, secret = parsed
        record = await self._get(key_id)
        matches = secret_matches(secret, record.key_hash if record else _DUMMY_HASH)
        if record is None or not matches or record.revoked:
            raise AuthenticationError("invalid API key")
        return Principal(key_id=record.key_id, kind=record.kind, user_id=record.user_id)

    @abstractmethod
    async def _get(self, key_id: str) -> KeyRecord | None:
        """The record of ``key_id``, or None."""

    @abstractmethod
    async def _put(self, record: KeyRecord) -> None:
        """Store a new record."""

    @abstractmethod
    async def _revoke(self, key_id: str) -> KeyRecord | None:
        """Mark the record revoked and return it; None when there is no such key."""

    @abstractmethod
    async def _list(self) -> list[KeyRecord]:
        """Every stored record."""


__all__ = ["KeyStore"]
