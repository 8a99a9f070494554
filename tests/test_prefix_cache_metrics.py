"""Prefix-cache counts from the workers' step events: vLLM's hit counters (target, in tokens) and the draft's
own, the cache_config_info gauge, and the totals /health shows, parsed back as Prometheus and a client read them."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.http_api import build_http_app
from minedraft.batch_manager.prefix_stats import PrefixCacheCounters
from minedraft.batch_manager.step_observer import MetricsObserver
from minedraft.core.tokenizer import Tokenizer
from minedraft.observability.metrics import ServingMetrics
from minedraft.proto import control_pb2
from tests.step_driver_support import Stack, drive, word_tokenizer

Stats = control_pb2.PrefixCacheStats
STATUS = {"running": 1, "waiting": 0, "block_budget": 200, "reserved_blocks": 50, "block_size": 16, "k": 4,
          "mode": "psd", "configured_mode": "psd", "draft_connected": True, "batch_sizes": [1, 0],
          "prefix_cache": {"enabled": True, "target": {"cached_blocks": 120, "free_blocks": 150}}}


def scrape(metrics: ServingMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> (labels, value) of every sample, as Prometheus parses the text."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    ((labels, value),) = samples[name]
    assert labels == {"model_name": "m"}
    return value


def verify_event(step: int, target: Stats, colocated_draft: Stats | None = None) -> control_pb2.WorkerEvent:
    event = control_pb2.WorkerEvent(step=step, prefix_cache=target)
    if colocated_draft is not None:
        event.draft_prefix_cache.CopyFrom(colocated_draft)
    return event


def test_target_and_draft_hits_are_summed_into_their_own_counters() -> None:
    metrics = ServingMetrics("m", lambda: STATUS)
    observer = MetricsObserver(metrics)
    observer.verify_done(verify_event(1, Stats(queries=40, hits=32, cached_blocks=2)), "ar", 1.0)
    observer.verify_done(verify_event(2, Stats(queries=18, hits=16)), "psd", 1.0)
    observer.draft_done(control_pb2.WorkerEvent(step=2, prefix_cache=Stats(queries=18, hits=0)))
    observer.draft_done(control_pb2.WorkerEvent(step=3, prefix_cache=Stats(queries=7, hits=4)))
    # A verifier with a colocated draft model reports the draft's cache beside the target's.
    observer.verify_done(verify_event(4, Stats(queries=10, hits=8), Stats(queries=10, hits=6)), "sd", 1.0)
    observer.verify_done(control_pb2.WorkerEvent(step=5), "ar", 1.0)  # a step that looked nothing up
    s = scrape(metrics)
    assert total(s, "vllm:prefix_cache_queries_total") == 40 + 18 + 10
    assert total(s, "vllm:prefix_cache_hits_total") == 32 + 16 + 8
    assert total(s, "minedraft:draft_prefix_cache_queries_total") == 18 + 7 + 10
    assert total(s, "minedraft:draft_prefix_cache_hits_total") == 0 + 4 + 6


def test_counters_exist_at_zero_before_any_lookup() -> None:
    s = scrape(ServingMetrics("m", lambda: STATUS))
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "minedraft:draft_prefix_cache_queries_total", "minedraft:draft_prefix_cache_hits_total"):
        assert total(s, name) == 0


def test_cache_config_info_carries_vllms_labels() -> None:
    s = scrape(ServingMetrics("m", lambda: STATUS))
    ((labels, value),) = s["vllm:cache_config_info"]
    assert value == 1
    assert labels == {"model_name": "m", "block_size": "16", "num_gpu_blocks": "200", "enable_prefix_caching": "True",
                      "engine": "0"}
    off = scrape(ServingMetrics("m", lambda: {**STATUS, "prefix_cache": {"enabled": False}}))
    assert off["vllm:cache_config_info"][0][0]["enable_prefix_caching"] == "False"
    bare = scrape(ServingMetrics("m", dict))  # a backend whose status has none of it still scrapes
    assert bare["vllm:cache_config_info"][0][0]["enable_prefix_caching"] == "False"


def test_kv_usage_counts_cached_free_blocks_as_free() -> None:
    """120 blocks hold cached prefixes, but only the 50 the running sequences may hold are in use (vLLM's rule)."""
    s = scrape(ServingMetrics("m", lambda: STATUS))
    assert total(s, "vllm:kv_cache_usage_perc") == 50 / 200


def test_snapshot_sums_counts_keeps_latest_gauges_and_rounds_the_rate() -> None:
    counters = PrefixCacheCounters()
    assert counters.snapshot()["target"] == {"queries": 0, "hits": 0, "hit_rate": 0.0, "cached_blocks": 0,
                                             "free_blocks": 0, "prefill_tokens": 0, "evictions": 0}
    counters.add(Stats(queries=30, hits=16, cached_blocks=4, free_blocks=90, prefill_tokens=14, evictions=1), False)
    counters.add(Stats(queries=30, hits=0, cached_blocks=3, free_blocks=80, prefill_tokens=30, evictions=2), False)
    counters.add(Stats(queries=9, hits=8, cached_blocks=7, free_blocks=60, prefill_tokens=1), draft=True)
    snap = counters.snapshot()
    assert snap["target"] == {"queries": 60, "hits": 16, "hit_rate": 0.2667, "cached_blocks": 3, "free_blocks": 80,
                              "prefill_tokens": 44, "evictions": 3}
    assert snap["draft"] == {"queries": 9, "hits": 8, "hit_rate": 0.8889, "cached_blocks": 7, "free_blocks": 60,
                             "prefill_tokens": 1, "evictions": 0}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return word_tokenizer(Path(tmp_path_factory.mktemp("tok")))


@pytest.mark.parametrize("enabled", [True, False])
def test_health_and_metrics_show_the_coordinators_cache(tokenizer: Tokenizer, enabled: bool) -> None:
    async def scenario() -> None:
        config = ManagerConfig(mode="psd", k=2, draft_retry_s=0.0, enable_prefix_caching=enabled,
                               max_num_batched_tokens=64)
        stack = Stack(tokenizer, config, lambda seq, step: 99)
        await stack.coordinator.start()
        try:
            stack.driver.counters.prefix_cache.add(Stats(queries=48, hits=32, cached_blocks=2, free_blocks=250), False)
            stack.driver.counters.prefix_cache.add(Stats(queries=48, hits=16, free_blocks=254), draft=True)
            app = build_http_app(stack.coordinator)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
                health = (await client.get("/health")).json()
            cache = health["prefix_cache"]
            assert (cache["enabled"], cache["max_num_batched_tokens"]) == (enabled, 64)
            assert (cache["target"]["hits"], cache["target"]["hit_rate"], cache["target"]["free_blocks"]) == (
                32, 0.6667, 250)
            assert (cache["draft"]["queries"], cache["draft"]["hit_rate"]) == (48, 0.3333)
            assert health["block_size"] == 16
            ((labels, _),) = scrape(ServingMetrics("fake", stack.coordinator.status))["vllm:cache_config_info"]
            assert labels == {"model_name": "fake", "block_size": "16", "num_gpu_blocks": "256",
                              "enable_prefix_caching": str(enabled), "engine": "0"}
        finally:
            await stack.coordinator.stop()

    drive(scenario)
