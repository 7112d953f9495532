"""The DynamoDB tables, defined once for the local stack, the tests and the SAM template.

Each definition is the keyword arguments of ``CreateTable``; every table also enables
TTL on :data:`TTL_ATTRIBUTE`. ``infra/dynamodb-tables.json`` at the repository root is
generated from here (``python -m agentscope_serverless.infra.dynamodb_tables``).

>>> [table["TableName"] for table in table_definitions()]
['agentscope-sessions', 'agentscope-state']

Layout (the backends' module docstrings say how they use it):

- **sessions**: ``pk``/``sk`` strings. A user's partition ``USER#<user hash>`` holds one
  item per session (``sk = SESSION#<session hash>``) and a creation counter; each session's
  messages live in their own partition ``SESSION#<user hash>#<session hash>``. The local
  secondary index ``by_creation`` sorts a user's sessions by ``creation_order``.
- **state**: ``pk``/``sk`` strings; one partition per user and session holding a meta item
  and one item (or a few, for large states) per round.
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


def table_definitions(
    sessions: str = "agentscope-sessions", state: str = "agentscope-state"
) -> list[dict[str, Any]]:
    """Every table the DynamoDB backends need, with the given names."""
    return [sessions_table(sessions), state_table(state)]


def as_json() -> str:
    """The definitions (with their TTL attribute) as the JSON kept in ``infra/``."""
    document = {
        "ttl_attribute": TTL_ATTRIBUTE,
        "tables": table_definitions(),
    }
    return json.dumps(document, indent=2) + "\n"


if __name__ == "__main__":
    print(as_json(), end="")


__all__ = [
    "SESSIONS_BY_CREATION_INDEX",
    "TTL_ATTRIBUTE",
    "as_json",
    "sessions_table",
    "state_table",
    "table_definitions",
]
