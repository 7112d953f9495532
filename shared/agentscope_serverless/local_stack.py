"""Local emulation of the cloud stores, on loopback ports: no AWS account, no Docker.

Starts ``redis-server`` (standalone, or a three-node Redis Cluster like managed Redis) and
moto's DynamoDB server, creates the DynamoDB tables, hands out URLs and stops everything
afterwards. The tests, the benchmark and a local server use it::

    with LocalStack(redis_cluster=True) as stack:
        os.environ.update(stack.environment())
        ...

Run ``python -m agentscope_serverless.local_stack`` to start the stack and print the
environment variables that point the services at it (Ctrl-C or SIGTERM stops it and its
servers).

This is a development tool: it needs the ``redis-server`` and ``redis-cli`` binaries
(``apt-get install -y redis-server``), ``openssl`` for a TLS Redis, and moto's server (a
dev dependency).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, Self

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.infra.dynamodb_tables import (
    TTL_ATTRIBUTE,
    table_definitions,
    tables_with_ttl,
)

LOOPBACK = "127.0.0.1"
# moto accepts any credentials; these never leave the machine.
LOCAL_AWS_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
LOCAL_AWS_REGION = "us-east-1"
_CLUSTER_BUS_OFFSET = 10000
_STARTUP_TIMEOUT = 30.0


def _binary(name: str, package: str = "redis-server") -> str:
    path = shutil.which(name)
    if path is None:
        raise ConfigurationError(
            f"{name} is not installed; install it with `apt-get install -y {package}` "
            "(or run ./scripts/bootstrap)"
        )
    return path


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


# The ports free_port() gave: the servers of a stack are given theirs before any binds,
# and the kernel may offer a port again while it is still free (moto was once given
# Redis's port, and could not start).
_GIVEN_PORTS: set[int] = set()


def free_port(*, with_cluster_bus: bool = False) -> int:
    """A free loopback port (and, for a cluster node, its bus port ``port + 10000``), never
    one this process was given before."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((LOOPBACK, 0))
            port: int = probe.getsockname()[1]
        if port in _GIVEN_PORTS or (
            with_cluster_bus and port + _CLUSTER_BUS_OFFSET in _GIVEN_PORTS
        ):
            continue
        if with_cluster_bus and not (
            port + _CLUSTER_BUS_OFFSET < 65536 and _port_is_free(port + _CLUSTER_BUS_OFFSET)
        ):
            continue
        _GIVEN_PORTS.add(port)
        if with_cluster_bus:
            _GIVEN_PORTS.add(port + _CLUSTER_BUS_OFFSET)
        return port
    raise RuntimeError("no free loopback port found")


def _wait_until(ready: Any, what: str, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + _STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} while starting")
        if ready():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not become ready within {_STARTUP_TIMEOUT:.0f} s")


def _stop_process(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


class RedisServer:
    """One ``redis-server`` process on a loopback port, without persistence.

    ``tls=True`` serves TLS only, with a fresh self-signed certificate (``url`` is then a
    ``rediss://`` URL that trusts it).

    >>> with RedisServer() as server:
    ...     server.url
    'redis://127.0.0.1:...'
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        password: str | None = None,
        cluster: bool = False,
        tls: bool = False,
    ) -> None:
        self._binary = _binary("redis-server")
        self._cli = _binary("redis-cli")
        self.port = port or free_port(with_cluster_bus=cluster)
        self.password = password
        self.cluster = cluster
        self._directory = tempfile.TemporaryDirectory(prefix=f"redis-{self.port}-")
        self.certificate = Path(self._directory.name) / "redis.crt" if tls else None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:<port>/0``; with TLS ``rediss://`` and the CA."""
        auth = f":{self.password}@" if self.password else ""
        if self.certificate is not None:
            return f"rediss://{auth}{LOOPBACK}:{self.port}/0?ssl_ca_certs={self.certificate}"
        return f"redis://{auth}{LOOPBACK}:{self.port}/0"

    def start(self) -> Self:
        """Start the server and wait until it answers PING (a restart keeps the port)."""
        args = [
            self._binary,
            "--port",
            str(self.port),
            "--bind",
            LOOPBACK,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._directory.name,
            "--loglevel",
            "warning",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        if self.certificate is not None:
            args += self._tls_arguments(self.certificate)
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(Path(self._directory.name) / "nodes.conf"),
                "--cluster-node-timeout",
                "5000",
            ]
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_until(
            lambda: self.cli("PING") == "PONG", f"redis-server on {self.port}", self._process
        )
        return self

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted but nothing is answered."""
        assert self._process is not None, "the server is not running"
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on (SIGCONT): it then serves what was sent meanwhile."""
        assert self._process is not None, "the server is not running"
        self._process.send_signal(signal.SIGCONT)

    def _tls_arguments(self, certificate: Path) -> list[str]:
        key = certificate.with_suffix(".key")
        if not certificate.exists():
            subprocess.run(
                [
                    _binary("openssl", "openssl"),
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    f"/CN={LOOPBACK}",
                    "-addext",
                    f"subjectAltName=IP:{LOOPBACK}",
                    "-keyout",
                    str(key),
                    "-out",
                    str(certificate),
                ],
                capture_output=True,
                timeout=30,
                check=True,
            )
        return [
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", str(certificate),
            "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(certificate),
            "--tls-auth-clients", "no",
        ]  # fmt: skip

    def stop(self) -> None:
        """Stop the server (its data is lost: it has no persistence)."""
        _stop_process(self._process)
        self._process = None

    def close(self) -> None:
        """Stop the server and remove its working directory."""
        self.stop()
        self._directory.cleanup()

    def cli(self, *command: str) -> str:
        """Run one command with ``redis-cli`` and return its output (stripped); '' on error."""
        args = [self._cli, "-h", LOOPBACK, "-p", str(self.port)]
        if self.certificate is not None:
            args += ["--tls", "--cacert", str(self.certificate)]
        if self.password:
            args += ["--no-auth-warning", "-a", self.password]
        try:
            done = subprocess.run(
                [*args, *command], capture_output=True, text=True, timeout=10, check=False
            )
        except subprocess.TimeoutExpired:
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RedisClusterServer:
    """A Redis Cluster of ``size`` primaries (no replicas) on loopback ports.

    Like managed Redis (ElastiCache Serverless, Valkey), it only accepts multi-key
    operations whose keys share a hash slot.
    """

    def __init__(self, size: int = 3) -> None:
        self.nodes = [RedisServer(cluster=True) for _ in range(size)]

    @property
    def url(self) -> str:
        """The URL of the first node; a cluster client discovers the others from it."""
        return self.nodes[0].url

    def start(self) -> Self:
        """Start the nodes, assign the slots and wait until the cluster state is ok."""
        for node in self.nodes:
            node.start()
        # Each node serves an equal share of the 16384 slots, then they meet.
        share = 16384 // len(self.nodes)
        for i, node in enumerate(self.nodes):
            last = 16383 if i == len(self.nodes) - 1 else (i + 1) * share - 1
            node.cli("CLUSTER", "ADDSLOTSRANGE", str(i * share), str(last))
            node.cli("CLUSTER", "SET-CONFIG-EPOCH", str(i + 1))
        for node in self.nodes[1:]:
            self.nodes[0].cli("CLUSTER", "MEET", LOOPBACK, str(node.port))
        _wait_until(self._ready, "redis cluster")
        return self

    def _ready(self) -> bool:
        expected = {"cluster_state:ok", f"cluster_known_nodes:{len(self.nodes)}"}
        return all(expected <= set(node.cli("CLUSTER", "INFO").split()) for node in self.nodes)

    def close(self) -> None:
        """Stop every node and remove their working directories."""
        for node in self.nodes:
            node.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# moto's own server handles requests on threads without per-item locking, so two concurrent
# UpdateItem calls on one item can both read the old value: real DynamoDB serialises writes
# to an item. One request at a time restores that guarantee for the emulator.
_MOTO_SERVER = """
import copy
import sys
import types

import moto.dynamodb.models as models
import moto.dynamodb.models.dynamo_type as dynamo_type
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication, MotoRequestHandler, create_backend_app,
)

# moto backs up the tables a transaction writes, to roll back a failed condition, with a
# deep copy of the whole table per item of the transaction: an append of 100 messages
# copied the table 100 times, and took seconds once it held a few thousand items. Here a
# table is copied once per transaction, and not at all for one of plain puts and deletes
# whose conditions all hold beforehand (none can fail then: requests are served one at a
# time), as every append's are.
_transact_write_items = models.DynamoDBBackend.transact_write_items


def conditions_hold(backend, transact_items):
    for item in transact_items:
        for kind, operation in item.items():
            condition = operation.get("ConditionExpression")
            if condition is None:
                continue
            table = backend.get_table(operation["TableName"])
            if kind == "Put":
                attributes = operation["Item"]
                key = {table.hash_key_attr: attributes[table.hash_key_attr]}
                if table.range_key_attr is not None:
                    key[table.range_key_attr] = attributes[table.range_key_attr]
            else:
                key = operation["Key"]
            expression = models.get_filter_expression(
                condition,
                operation.get("ExpressionAttributeNames"),
                operation.get("ExpressionAttributeValues"),
            )
            if not expression.expr(backend.get_item(operation["TableName"], key)):
                return False
    return True


def transact_write_items(self, transact_items):
    plain = all(
        kind in ("Put", "Delete", "ConditionCheck")
        for item in transact_items
        for kind in item
    )
    try:
        plain = plain and conditions_hold(self, transact_items)
    except Exception:
        plain = False  # moto's own call reports what is wrong
    tables = {}

    def deepcopy(value, memo=None):
        if not isinstance(value, models.Table):
            return copy.deepcopy(value, memo)
        if plain:
            return value
        if id(value) not in tables:
            tables[id(value)] = copy.deepcopy(value, memo)
        return tables[id(value)]

    models.copy = types.SimpleNamespace(deepcopy=deepcopy)
    try:
        return _transact_write_items(self, transact_items)
    finally:
        models.copy = copy


models.DynamoDBBackend.transact_write_items = transact_write_items

# moto sizes an item an UpdateItem sets an attribute of with the attribute's old value and
# its new one: a record rewritten from 200 KB to 300 KB (an A2A task's, as its reply grows)
# was refused as over the 400 KB DynamoDB allows, which counts the item as it would be.
_set_attribute = dynamo_type.LimitedSizeDict.__setitem__
_ABSENT = object()


def set_attribute(self, key, value):
    old = dict.pop(self, key, _ABSENT)
    try:
        _set_attribute(self, key, value)
    except Exception:
        if old is not _ABSENT:
            dict.__setitem__(self, key, old)
        raise


dynamo_type.LimitedSizeDict.__setitem__ = set_attribute
run_simple(
    sys.argv[1], int(sys.argv[2]), DomainDispatcherApplication(create_backend_app),
    threaded=False, request_handler=MotoRequestHandler,
)
"""


class DynamoDBServer:
    """moto's DynamoDB server in a subprocess, with the project's tables.

    moto keeps data in memory: a restart (same port) starts empty, and
    :meth:`create_tables` makes the tables again. moto never expires items by TTL.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        sessions_table: str = "agentscope-sessions",
        state_table: str = "agentscope-state",
        api_keys_table: str = "agentscope-api-keys",
        runs_table: str = "agentscope-runs",
    ) -> None:
        self.port = port or free_port()
        self.runs_table = runs_table
        self.sessions_table = sessions_table
        self.state_table = state_table
        self.api_keys_table = api_keys_table
        self.region = LOCAL_AWS_REGION
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, *, create_tables: bool = True) -> Self:
        """Start the server, wait until it answers, and create the tables."""
        self._process = subprocess.Popen(
            [sys.executable, "-c", _MOTO_SERVER, LOOPBACK, str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_until(self._answers, f"moto server on {self.port}", self._process)
        if create_tables:
            self.create_tables()
        return self

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted but nothing is answered."""
        assert self._process is not None, "the server is not running"
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on (SIGCONT): it then serves what was sent meanwhile."""
        assert self._process is not None, "the server is not running"
        self._process.send_signal(signal.SIGCONT)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1):  # noqa: S310
                return True
        except (urllib.error.URLError, OSError):
            return False

    def create_tables(self) -> None:
        """Create the session, state, API key and runs tables (with their TTL attribute)."""
        # A development tool, so a plain synchronous client; the services use aioboto3.
        import botocore.session

        # botocore's stubs do not know the DynamoDB operations of a plain client.
        client: Any = botocore.session.get_session().create_client(
            "dynamodb",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=LOCAL_AWS_CREDENTIALS["aws_access_key_id"],
            aws_secret_access_key=LOCAL_AWS_CREDENTIALS["aws_secret_access_key"],
        )
        for definition in table_definitions(
            self.sessions_table, self.state_table, self.api_keys_table, self.runs_table
        ):
            client.create_table(**definition)
        for name in tables_with_ttl(self.sessions_table, self.state_table, self.runs_table):
            client.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"AttributeName": TTL_ATTRIBUTE, "Enabled": True},
            )

    def stop(self) -> None:
        """Stop the server (its data is lost)."""
        _stop_process(self._process)
        self._process = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LocalStack:
    """Redis, optionally a Redis Cluster, and DynamoDB, started and stopped together.

    :meth:`environment` gives the settings (environment variables) that select the Redis
    and DynamoDB backends and point them at this stack.
    """

    def __init__(
        self,
        *,
        redis_cluster: bool = False,
        dynamodb: bool = True,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.redis = RedisServer()
        self.redis_cluster = RedisClusterServer() if redis_cluster else None
        self.dynamodb = DynamoDBServer() if dynamodb else None
        self._stack = contextlib.ExitStack()
        self._progress = progress or (lambda message: None)

    def start(self) -> Self:
        """Start every server; on failure, stop the ones already started.

        Each step is reported to ``progress`` as it begins (start-up takes seconds).
        """
        with contextlib.ExitStack() as starting:
            self._progress(f"starting redis-server on {LOOPBACK}:{self.redis.port}")
            starting.enter_context(self.redis)
            if self.redis_cluster is not None:
                ports = ", ".join(str(node.port) for node in self.redis_cluster.nodes)
                self._progress(f"starting a Redis Cluster on {LOOPBACK} ports {ports}")
                starting.enter_context(self.redis_cluster)
            if self.dynamodb is not None:
                self._progress(
                    f"starting moto's DynamoDB server on {LOOPBACK}:{self.dynamodb.port}"
                )
                starting.callback(self.dynamodb.stop)
                self.dynamodb.start(create_tables=False)
                self._progress("creating the DynamoDB tables")
                self.dynamodb.create_tables()
            self._stack = starting.pop_all()
        return self

    def ports(self) -> str:
        """Which server listens where, in words: ``Redis on 127.0.0.1:6380, ...``."""
        described = [f"Redis on {LOOPBACK}:{self.redis.port}"]
        if self.redis_cluster is not None:
            ports = ",".join(str(node.port) for node in self.redis_cluster.nodes)
            described.append(f"Redis Cluster on {LOOPBACK}:{ports}")
        if self.dynamodb is not None:
            described.append(f"DynamoDB on {LOOPBACK}:{self.dynamodb.port}")
        return ", ".join(described)

    def stop(self) -> None:
        """Stop every server."""
        self._stack.close()

    def environment(self) -> dict[str, str]:
        """Environment variables selecting the durable backends on this stack."""
        env = {
            "SESSION_HISTORY_BACKEND": "redis",
            "MEMORY_BACKEND": "redis",
            "STATE_BACKEND": "redis",
            "REDIS_URL": self.redis.url,
        }
        if self.dynamodb is not None:
            env.update(
                {
                    "SESSION_HISTORY_BACKEND": "dynamodb",
                    "STATE_BACKEND": "dynamodb",
                    "DYNAMODB_ENDPOINT_URL": self.dynamodb.endpoint_url,
                    "DYNAMODB_SESSIONS_TABLE": self.dynamodb.sessions_table,
                    "DYNAMODB_STATE_TABLE": self.dynamodb.state_table,
                    "DYNAMODB_RUNS_TABLE": self.dynamodb.runs_table,
                    "AUTH_KEYS_TABLE": self.dynamodb.api_keys_table,
                    "AWS_REGION": self.dynamodb.region,
                    "AWS_DEFAULT_REGION": self.dynamodb.region,
                    "AWS_ACCESS_KEY_ID": LOCAL_AWS_CREDENTIALS["aws_access_key_id"],
                    "AWS_SECRET_ACCESS_KEY": LOCAL_AWS_CREDENTIALS["aws_secret_access_key"],
                }
            )
        return env

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Stopped(Exception):
    """A stop signal (SIGTERM) received: unwind, stopping every server."""


def _stop_on_signal(signum: int, frame: object) -> NoReturn:
    raise Stopped(signum)


def _report(message: str) -> None:
    print(f"local stack: {message}...", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Start the stack, print its environment, and run until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m agentscope_serverless.local_stack",
        description="Start Redis and moto's DynamoDB server on free loopback ports, create "
        "the tables, and print the environment variables that point the services at them. "
        "Ctrl-C or SIGTERM stops them.",
    )
    parser.add_argument(
        "--redis-cluster",
        action="store_true",
        help="also start a three-node Redis Cluster (like ElastiCache Serverless)",
    )
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C does, so the servers are stopped on the way out.
    signal.signal(signal.SIGTERM, _stop_on_signal)
    with contextlib.suppress(KeyboardInterrupt, Stopped):
        try:
            stack = LocalStack(redis_cluster=args.redis_cluster, progress=_report)
        except ConfigurationError as exc:
            print(f"local stack: {exc.message}", file=sys.stderr)
            raise SystemExit(2) from None
        with stack:
            for name, value in stack.environment().items():
                print(f"export {name}={value}")
            print(
                f"# local stack running: {stack.ports()}; Ctrl-C or SIGTERM stops it",
                flush=True,
            )
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()


__all__ = [
    "LOCAL_AWS_CREDENTIALS",
    "LOCAL_AWS_REGION",
    "DynamoDBServer",
    "LocalStack",
    "RedisClusterServer",
    "RedisServer",
    "free_port",
]
