"""CONTRACT §1: the service lifecycle and ServiceManager."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentscope_serverless.services.base import ServiceWithLifecycleManager
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.memory import InMemoryMemoryService


class RecordingService(ServiceWithLifecycleManager):
    def __init__(self, name: str, log: list[str], *, fail_start: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail_start = fail_start
        self.running = False

    async def start(self) -> None:
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")
        self.running = True
        self.log.append(f"start {self.name}")

    async def stop(self) -> None:
        self.running = False
        self.log.append(f"stop {self.name}")

    async def health(self) -> bool:
        return self.running


class BrokenHealthService(RecordingService):
    async def health(self) -> bool:
        raise ConnectionError("down")


class SilentHealthService(RecordingService):
    """A service whose store accepts connections but never answers."""

    async def health(self) -> bool:
        await asyncio.sleep(3600)
        return True


def test_service_with_lifecycle_manager_is_abstract() -> None:
    with pytest.raises(TypeError):
        ServiceWithLifecycleManager()  # type: ignore[abstract]


async def test_async_with_on_a_service_starts_and_stops() -> None:
    log: list[str] = []
    service = RecordingService("a", log)
    async with service as entered:
        assert entered is service
        assert await service.health()
    assert log == ["start a", "stop a"]


def test_register_uses_the_class_name_without_service_lower_cased() -> None:
    manager = ServiceManager().register(InMemoryMemoryService)
    assert manager.list_services() == ["inmemorymemory"]
    assert isinstance(manager.inmemorymemory, InMemoryMemoryService)


def test_register_passes_arguments_and_chains() -> None:
    log: list[str] = []
    manager = (
        ServiceManager()
        .register(RecordingService, "first", log, name="one")
        .register(RecordingService, "second", log, name="two")
    )
    assert manager.list_services() == ["one", "two"]
    one = manager["one"]
    assert isinstance(one, RecordingService) and one.name == "first"


def test_register_service_registers_an_instance() -> None:
    service = RecordingService("x", [])
    manager = ServiceManager().register_service("x", service)
    assert manager.x is service
    assert manager["x"] is service
    assert manager.get("x") is service
    assert manager.has_service("x")
    assert not manager.has_service("y")
    assert manager.get("y") is None
    assert manager.get("y", "fallback") == "fallback"
    assert manager.all_services == {"x": service}


def test_all_services_is_a_copy() -> None:
    manager = ServiceManager().register_service("x", RecordingService("x", []))
    manager.all_services.clear()
    assert manager.list_services() == ["x"]


def test_duplicate_names_are_refused() -> None:
    manager = ServiceManager().register_service("x", RecordingService("x", []))
    with pytest.raises(ValueError, match="already registered"):
        manager.register_service("x", RecordingService("x", []))


def test_unknown_names_fail_clearly() -> None:
    manager = ServiceManager().register_service("x", RecordingService("x", []))
    with pytest.raises(AttributeError, match="no service named 'nope'"):
        _ = manager.nope
    with pytest.raises(KeyError, match="registered: x"):
        _ = manager["nope"]


async def test_services_start_in_order_and_stop_in_reverse() -> None:
    log: list[str] = []
    manager = (
        ServiceManager()
        .register(RecordingService, "a", log, name="a")
        .register(RecordingService, "b", log, name="b")
        .register(RecordingService, "c", log, name="c")
    )
    async with manager:
        assert log == ["start a", "start b", "start c"]
    assert log[3:] == ["stop c", "stop b", "stop a"]


async def test_a_failing_start_stops_the_services_already_started() -> None:
    log: list[str] = []
    manager = (
        ServiceManager()
        .register(RecordingService, "a", log, name="a")
        .register(RecordingService, "b", log, name="b")
        .register(RecordingService, "c", log, name="c", fail_start=True)
        .register(RecordingService, "d", log, name="d")
    )
    with pytest.raises(RuntimeError, match="c cannot start"):
        async with manager:
            pass
    assert log == ["start a", "start b", "stop b", "stop a"]


async def test_health_check_reports_every_service() -> None:
    log: list[str] = []
    manager = (
        ServiceManager()
        .register(RecordingService, "a", log, name="up")
        .register(BrokenHealthService, "b", log, name="broken")
    )
    assert await manager.health_check() == {"up": False, "broken": False}
    async with manager:
        assert await manager.health_check() == {"up": True, "broken": False}


async def test_a_health_check_that_does_not_answer_counts_as_down_in_bounded_time() -> None:
    log: list[str] = []
    manager = (
        ServiceManager()
        .register(SilentHealthService, "a", log, name="silent")
        .register(SilentHealthService, "b", log, name="silent too")
        .register(RecordingService, "c", log, name="up")
    )
    async with manager:
        began = time.monotonic()
        assert await manager.health_check(limit=0.3) == {
            "silent": False,
            "silent too": False,
            "up": True,
        }
        # Checked together: the two silent ones cost one limit, not one each.
        assert time.monotonic() - began < 0.55


async def test_manager_starts_real_services() -> None:
    async with ServiceManager().register(InMemoryMemoryService, name="memory") as manager:
        memory = manager.memory
        assert isinstance(memory, InMemoryMemoryService)
        await memory.add_memory("u1", [{"role": "user", "content": "hello"}])
        assert len(await memory.list_memory("u1")) == 1
