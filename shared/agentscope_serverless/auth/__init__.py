"""API keys: hashed storage, verification, and the principal a request acts as.

>>> from agentscope_serverless.auth import InMemoryKeyStore
>>> store = InMemoryKeyStore()

Backends: :class:`InMemoryKeyStore`, :class:`FileKeyStore` and
:class:`~agentscope_serverless.auth.dynamodb.DynamoDBKeyStore` (not imported here: it needs
aioboto3); pick one from settings with :func:`create_key_store`.
"""

from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.auth.factory import create_key_store
from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.auth.in_memory import InMemoryKeyStore
from agentscope_serverless.auth.keys import IssuedKey, KeyKind, KeyRecord, Principal

__all__ = [
    "FileKeyStore",
    "InMemoryKeyStore",
    "IssuedKey",
    "KeyKind",
    "KeyRecord",
    "KeyStore",
    "Principal",
    "create_key_store",
]
