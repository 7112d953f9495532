"""Full collections walk only what is new, and garbage cycles are still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from agentscope_serverless.collector import (
    THRESHOLDS,
    keep_pauses_short,
    stop_keeping_pauses_short,
)


class Node:
    """A container that can be part of a cycle and be watched with a weak reference."""

    def __init__(self) -> None:
        self.other: Node | None = None


def dead_frozen_cycle() -> weakref.ref[Node]:
    """A cycle frozen while alive (it survived a full collection), now garbage; a weak
    reference to one of its nodes tells when it is collected."""
    first, second = Node(), Node()
    first.other, second.other = second, first
    watch = weakref.ref(first)
    gc.collect()
    return watch


@pytest.fixture
def policy() -> Iterator[None]:
    keep_pauses_short()
    try:
        yield
    finally:
        stop_keeping_pauses_short()


def test_the_survivors_of_a_full_collection_are_left_out_of_the_next(policy: None) -> None:
    frozen = gc.get_freeze_count()
    kept = [[index] for index in range(10_000)]
    gc.collect()
    assert gc.get_freeze_count() >= frozen + len(kept)
    assert not any(item is kept for item in gc.get_objects())  # out of the collector's reach


def test_a_cycle_that_dies_frozen_is_collected_once_the_heap_has_doubled(policy: None) -> None:
    watch = dead_frozen_cycle()
    gc.collect()
    assert watch() is not None  # frozen garbage waits...
    kept = [[index] for index in range(2 * gc.get_freeze_count() + 1)]
    for _ in range(3):
        gc.collect()
    assert watch() is None  # ...until the frozen set doubles and everything is walked again
    assert kept


def test_the_survivors_of_a_middle_collection_are_frozen_too(policy: None) -> None:
    gc.collect()
    kept = [[index] for index in range(1_000)]
    gc.collect(1)
    # Out of the collector's reach. (Not a count of the frozen set: frozen objects freed
    # meanwhile, anywhere in the process, leave it.)
    kept_ids = {id(item) for item in kept} | {id(kept)}
    assert not any(id(item) in kept_ids for item in gc.get_objects())


def test_once_unfrozen_everything_waits_for_the_next_full_collection(policy: None) -> None:
    watch = dead_frozen_cycle()
    kept = [[index] for index in range(2 * gc.get_freeze_count() + 1)]
    for _ in range(3):  # frozen: the frozen set has doubled, so a full collection unfreezes
        gc.collect()
        if gc.get_freeze_count() == 0:
            break
    assert gc.get_freeze_count() == 0
    gc.collect(1)  # a middle collection does not freeze it all again
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert watch() is None
    assert kept


def test_frozen_objects_freed_since_do_not_count_toward_the_doubling(policy: None) -> None:
    watch = dead_frozen_cycle()
    for _ in range(4):
        # As many objects as are frozen, alive through a full collection (so frozen), then
        # freed: the frozen set is back where it was each time, never doubled.
        transient = [[index] for index in range(gc.get_freeze_count())]
        gc.collect()
        del transient
    gc.collect()
    assert watch() is not None  # no walk of the whole heap was due


def test_young_objects_are_collected_in_larger_batches(policy: None) -> None:
    young: list[int] = []
    gc.callbacks.append(lambda phase, info: phase == "start" and young.append(info["generation"]))
    try:
        kept = [[index] for index in range(THRESHOLDS[0] // 2)]  # 700 at CPython's default
        assert not young
    finally:
        gc.callbacks.pop()
    assert kept


def test_stopping_gives_the_collector_every_object_back() -> None:
    before = gc.get_threshold()
    keep_pauses_short()
    gc.collect()
    assert gc.get_freeze_count() > 0
    stop_keeping_pauses_short()
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
    gc.collect()
    assert gc.get_freeze_count() == 0
