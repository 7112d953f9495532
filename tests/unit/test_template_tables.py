"""The SAM template's DynamoDB tables match the definitions the backends and local stack use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.infra.dynamodb_tables import (
    TTL_ATTRIBUTE,
    api_keys_table,
    runs_table,
    sessions_table,
    state_table,
)
from agentscope_serverless.packaging.sam import load_template

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"
SCHEMA_FIELDS = ("AttributeDefinitions", "KeySchema", "LocalSecondaryIndexes", "BillingMode")


def as_set(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(items, key=repr)


@pytest.mark.parametrize(
    ("resource", "definition", "expires"),
    [
        ("SessionsTable", sessions_table(), True),
        ("StateTable", state_table(), True),
        ("ApiKeysTable", api_keys_table(), False),
        ("RunsTable", runs_table(), True),
    ],
)
def test_the_template_table_matches_its_definition(
    resource: str, definition: dict[str, Any], expires: bool
) -> None:
    table = load_template(TEMPLATE)["Resources"][resource]
    assert table["Type"] == "AWS::DynamoDB::Table"
    properties = table["Properties"]
    for field in SCHEMA_FIELDS:
        if field == "AttributeDefinitions":
            assert as_set(properties[field]) == as_set(definition[field]), field
        else:
            assert properties.get(field) == definition.get(field), field
    ttl = properties.get("TimeToLiveSpecification")
    assert ttl == ({"AttributeName": TTL_ATTRIBUTE, "Enabled": True} if expires else None)


def test_every_function_may_read_the_key_table() -> None:
    resources = load_template(TEMPLATE)["Resources"]
    functions = {n: r for n, r in resources.items() if r["Type"] == "AWS::Serverless::Function"}
    for name, function in functions.items():
        policies = function["Properties"]["Policies"]
        # Reading a key by its id: authenticating a caller (tests/deploy/test_sam.py checks
        # the policy allows no more).
        assert {"Ref": "ApiKeyLookupPolicy"} in policies, name
