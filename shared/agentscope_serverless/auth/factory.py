"""Build the key store selected by settings (``AUTH_KEYS_BACKEND``).

>>> from agentscope_serverless.settings import load_settings
>>> type(create_key_store(load_settings(auth_keys_backend="in_memory"))).__name__
'InMemoryKeyStore'
"""

from __future__ import annotations

from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.auth.in_memory import InMemoryKeyStore
from agentscope_serverless.settings import Settings


def create_key_store(settings: Settings) -> KeyStore:
    """The key store of ``AUTH_KEYS_BACKEND`` (not started)."""
    if settings.auth_keys_backend == "file":
        return FileKeyStore(settings.auth_keys_file)
    if settings.auth_keys_backend == "dynamodb":
        # Imported only when selected: it is the one key store that needs aioboto3.
        from agentscope_serverless.auth.dynamodb import DynamoDBKeyStore

        return DynamoDBKeyStore(
            settings.auth_keys_table,
            endpoint_url=settings.dynamodb_endpoint_url,
            region_name=settings.aws_region,
            cache_seconds=settings.auth_keys_cache_seconds,
        )
    return InMemoryKeyStore()


__all__ = ["create_key_store"]
