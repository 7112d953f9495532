"""API keys: their format, their hash, and what is stored about them.

A key looks like ``ask_<key_id>_<secret>``: ``key_id`` (16 hex characters) finds the record,
``secret`` (43 URL-safe characters, 256 random bits) proves possession. Only the SHA-256
of the secret is stored, and it is compared in constant time.

>>> key_id, secret, key = new_key()
>>> parse_key(key) == (key_id, secret)
True
>>> parse_key("not-a-key") is None
True
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

KEY_PREFIX = "ask"
KeyKind = Literal["user", "service"]

# A key's id: what finds its record, and what `keys list` shows.
KEY_ID_PATTERN = r"[0-9a-f]{16}"
_KEY = re.compile(rf"^ask_({KEY_ID_PATTERN})_([A-Za-z0-9_-]{{43}})$")


def new_key() -> tuple[str, str, str]:
    """A fresh ``(key_id, secret, key)``."""
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return key_id, secret, f"{KEY_PREFIX}_{key_id}_{secret}"


def parse_key(key: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed key, or None."""
    match = _KEY.match(key)
    return (match.group(1), match.group(2)) if match else None


def hash_secret(secret: str) -> str:
    """The stored form of a secret: its SHA-256, in hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, key_hash: str) -> bool:
    """Whether ``secret`` hashes to ``key_hash``, compared in constant time."""
    return hmac.compare_digest(hash_secret(secret), key_hash)


class KeyRecord(BaseModel):
    """What a key store keeps about a key (never the key itself).

    A ``user`` key belongs to one ``user_id`` and acts only as that user; a ``service`` key
    has no user and acts for the user each request names.
    """

    # A record refused (a hand edit of the key file) is logged: never with its hash.
    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    key_id: str = Field(pattern=rf"^{KEY_ID_PATTERN}$")
    key_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    kind: KeyKind
    user_id: str | None = None
    created_at: int = Field(default_factory=lambda: int(time.time()))
    revoked: bool = False

    @model_validator(mode="after")
    def _user_matches_kind(self) -> KeyRecord:
        if self.kind == "user" and not self.user_id:
            raise ValueError("a user key needs a user_id")
        if self.kind == "service" and self.user_id is not None:
            raise ValueError("a service key has no user_id")
        return self


class Principal(BaseModel):
    """Who a request authenticated as: the key's id, kind and (for user keys) user."""

    model_config = ConfigDict(frozen=True)

    key_id: str
    kind: KeyKind
    user_id: str | None = None


class IssuedKey(BaseModel):
    """A key just created: the clear ``key`` (shown once, never stored) and its record."""

    model_config = ConfigDict(frozen=True)

    key: str
    record: KeyRecord


__all__ = [
    "KEY_ID_PATTERN",
    "KEY_PREFIX",
    "IssuedKey",
    "KeyKind",
    "KeyRecord",
    "Principal",
    "hash_secret",
    "new_key",
    "parse_key",
    "secret_matches",
]
