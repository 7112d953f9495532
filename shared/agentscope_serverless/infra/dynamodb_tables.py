"""The DynamoDB tables, defined once for the local stack, the tests and the SAM template.

Each definition is the keyword arguments of ``CreateTable``; the sessions and state tables
also enable TTL on :data:`TTL_ATTRIBUTE` (:func:`tables_with_ttl`).
``infra/dynamodb-tables.json`` at the repository root is generated from here
(``python -m agentscope_serverless.infra.dynamodb_tables``).

>>> [table["TableName"] for table in table_definitions()]
['agentscope-sessions', 'agentscope-state', 'agentscope-api-keys', 'agentscope-runs']

Layout (the backends' module docstrings say how they use it):

- **sessions**: ``pk``/``sk`` strings. A user's partition ``USER#<user hash>`` holds one
  item per session (``sk = SESSION#<session hash>``), a creation counter, and a purge
  record per deleted session whose messages are not all deleted yet; each session's
  messages live in their own partition ``SESSION#<user hash>#<session hash>``. The local
  secondary index ``by_creation`` sorts a user's sessions by ``creation_order``.
- **state**: ``pk``/``sk`` strings; one partition per user and session holding a meta item
  and one item (or a few, for large states) per round.
- **runs**: ``pk``/``sk`` strings; one partition per run holding its record and its events,
  and one per session listing its runs (see :mod:`agentscope_serverless.services.runs.dynamodb`).
- **api keys**: partition key ``key_id`` string, one item per API key holding its hash
  (see :mod:`agentscope_serverless.auth.dynamodb`); no TTL (revoked keys stay listed).
"""

from __future__ import annotations

import json
from typing import Any

TTL_ATTRIBUTE = "expires_at"
SESSIONS_BY_CREATION_INDEX = "by_creation"

_KEYS = [
    {"AttributeName": "pk", "KeyType": "HASH"},
    {"AttributeName": "sk", "KeyType": "RANGE"},
]


def sessions_table(name: str = "agentscope-sessions") -> dict[str, Any]:
    """``CreateTable`` arguments of the session history table."""
    return {
        "TableName": name,
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "creation_order", "AttributeType": "N"},
        ],
        "KeySchema": _KEYS,
        "LocalSecondaryIndexes": [
            {
                "IndexName": SESSIONS_BY_CREATION_INDEX,
                "KeySchema": [
                    {"AttributeName": "pk", "KeyType": "HASH"},
                    {"AttributeName": "creation_order", "KeyType": "RANGE"},
                ],
                "Projection": {
                    "ProjectionType": "INCLUDE",
                    "NonKeyAttributes": ["session_id", TTL_ATTRIBUTE],
                },
            }
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }


def state_table(name: str = "agentscope-state") -> dict[str, Any]:
    """``CreateTable`` arguments of the agent state table."""
    return {
        "TableName": name,
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        "KeySchema": _KEYS,
        "BillingMode": "PAY_PER_REQUEST",
    }


def api_keys_table(name: str = "agentscope-api-keys") -> dict[str, Any]:
    """``CreateTable`` arguments of the API key table (the dynamodb key store)."""
    return {
        "TableName": name,
        "AttributeDefinitions": [{"AttributeName": "key_id", "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": "key_id", "KeyType": "HASH"}],
        "BillingMode": "PAY_PER_REQUEST",
    }


def runs_table(name: str = "agentscope-runs") -> dict[str, Any]:
    """``CreateTable`` arguments of the runs table (stored runs and their events)."""
    return state_table(name)


def table_definitions(
    sessions: str = "agentscope-sessions",
    state: str = "agentscope-state",
    api_keys: str = "agentscope-api-keys",
    runs: str = "agentscope-runs",
) -> list[dict[str, Any]]:
    """Every table the DynamoDB backends need, with the given names."""
    return [
        sessions_table(sessions),
        state_table(state),
        api_keys_table(api_keys),
        runs_table(runs),
    ]


def tables_with_ttl(
    sessions: str = "agentscope-sessions",
    state: str = "agentscope-state",
    runs: str = "agentscope-runs",
) -> list[str]:
    """The tables whose items expire by :data:`TTL_ATTRIBUTE` (API keys never expire)."""
    return [sessions, state, runs]


def as_json() -> str:
    """The definitions (with their TTL attribute) as the JSON kept in ``infra/``."""
    document = {
        "ttl_attribute": TTL_ATTRIBUTE,
        "ttl_tables": tables_with_ttl(),
        "tables": table_definitions(),
    }
    return json.dumps(document, indent=2) + "\n"


if __name__ == "__main__":
    print(as_json(), end="")


__all__ = [
    "SESSIONS_BY_CREATION_INDEX",
    "TTL_ATTRIBUTE",
    "api_keys_table",
    "as_json",
    "runs_table",
    "sessions_table",
    "state_table",
    "table_definitions",
    "tables_with_ttl",
]
