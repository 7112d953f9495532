"""Changes of a Redis Cluster's layout made under a running client, as an operator makes them."""

from __future__ import annotations

from agentscope_serverless.local_stack import LOOPBACK, RedisClusterServer, RedisServer


def move_slot(cluster: RedisClusterServer, slot: int) -> None:
    """Move ``slot`` and its keys to the next primary, as a reshard does: the slot is
    migrated, its keys moved, then every node is told its new owner."""
    ids = {node.port: node.cli("CLUSTER", "MYID") for node in cluster.nodes}
    owner = slot_owner(cluster, slot)
    target = cluster.nodes[(cluster.nodes.index(owner) + 1) % len(cluster.nodes)]
    target.cli("CLUSTER", "SETSLOT", str(slot), "IMPORTING", ids[owner.port])
    owner.cli("CLUSTER", "SETSLOT", str(slot), "MIGRATING", ids[target.port])
    while keys := owner.cli("CLUSTER", "GETKEYSINSLOT", str(slot), "100").split():
        moved = owner.cli("MIGRATE", LOOPBACK, str(target.port), "", "0", "5000", "KEYS", *keys)
        assert moved == "OK", moved
    for node in cluster.nodes:
        assert node.cli("CLUSTER", "SETSLOT", str(slot), "NODE", ids[target.port]) == "OK"


def slot_owner(cluster: RedisClusterServer, slot: int) -> RedisServer:
    """The primary that serves ``slot``, as the first node sees it."""
    for line in cluster.nodes[0].cli("CLUSTER", "NODES").splitlines():
        # <id> <ip:port@bus-port> <flags> <primary> <ping> <pong> <epoch> <link> <slots>...
        fields = line.split()
        port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        for ranged in fields[8:]:
            first, _, last = ranged.partition("-")
            if first.isdigit() and int(first) <= slot <= int(last or first):
                return next(node for node in cluster.nodes if node.port == port)
    raise AssertionError(f"no primary serves slot {slot}")
