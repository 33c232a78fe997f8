"""The store's per-process request cache: parsed once, bounded, least recently used out first."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from airflow_gpupool.ledger.store.transactions import REQUEST_CACHE_SIZE, RequestCache
from airflow_gpupool.resources import GpuRequest


def row(rid: str, gpus: int = 1) -> SimpleNamespace:
    """A reservation row as the cache reads it: an id and the request's JSON."""
    return SimpleNamespace(id=rid, request=json.dumps(GpuRequest(gpus=gpus).to_dict()))


def test_a_request_is_parsed_once_and_then_served_from_the_cache() -> None:
    cache = RequestCache(size=4)
    first = cache.of(row("a", gpus=2))
    assert first == GpuRequest(gpus=2)
    assert cache.of(row("a", gpus=2)) is first
    assert len(cache) == 1


def test_the_cache_stays_bounded_however_many_requests_pass_through_it() -> None:
    cache = RequestCache(size=10)
    for i in range(1000):
        cache.of(row(f"r{i}"))
        assert len(cache) <= 10
    assert len(cache) == 10


def test_the_least_recently_used_request_goes_first() -> None:
    cache = RequestCache(size=2)
    a = cache.of(row("a"))
    cache.put("b", GpuRequest(gpus=2))
    assert cache.of(row("a")) is a  # a used again: b is now the oldest
    cache.put("c", GpuRequest(gpus=3))

    assert cache.of(row("a")) is a
    assert cache.of(row("c", gpus=3)) == GpuRequest(gpus=3)
    evicted = cache.of(row("b", gpus=2))  # parsed again from its row
    assert evicted == GpuRequest(gpus=2)
    assert len(cache) == 2


def test_the_default_bound_is_documented_and_a_bound_below_one_is_refused() -> None:
    assert RequestCache().size == REQUEST_CACHE_SIZE
    with pytest.raises(ValueError, match="at least one"):
        RequestCache(size=0)


def test_threads_sharing_the_cache_keep_it_bounded() -> None:
    cache = RequestCache(size=50)
    rows = [row(f"r{i}") for i in range(500)]
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(2000):
                assert cache.of(rows[(i * 7 + offset) % len(rows)]) == GpuRequest(gpus=1)
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(cache) == 50
