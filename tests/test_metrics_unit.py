"""The metric families, parsed back with Prometheus' own text parser."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from minedraft.observability.metrics import ServingMetrics

STATUS = {"preemptions": 2, "verifier_reconnects": 1,
          "running": 3, "waiting": 2, "block_budget": 200, "reserved_blocks": 50, "k": 4, "mode": "psd",
          "configured_mode": "psd", "draft_connected": True, "batch_sizes": [2, 1], "draft_link_transport": "gloo"}


def samples(metrics: ServingMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(all_samples: dict, name: str, **labels: str) -> float:
    return all_samples[(name, tuple(sorted({"model_name": "m", **labels}.items())))]


def test_speculation_counters_follow_vllm_meanings() -> None:
    metrics = ServingMetrics("m", lambda: STATUS)
    metrics.verdicts(4, [0, 2, 4])  # three sequences, k = 4: accepted 0, 2 and 4 drafts
    metrics.verdicts(0, [1, 1])  # an AR step carries no drafts and counts nothing
    s = samples(metrics)
    assert value(s, "vllm:spec_decode_num_drafts_total") == 3
    assert value(s, "vllm:spec_decode_num_draft_tokens_total") == 12
    assert value(s, "vllm:spec_decode_num_accepted_tokens_total") == 6
    per_pos = [value(s, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(4)]
    assert per_pos == [2, 2, 1, 1]


def test_request_life_cycle_and_gauges() -> None:
    metrics = ServingMetrics("m", lambda: STATUS)
    metrics.request_admitted(0.01)
    metrics.first_token(0.05)
    metrics.tokens_streamed(1, None)
    metrics.tokens_streamed(3, 0.02)
    metrics.request_finished("length", prompt_tokens=7, output_tokens=4, e2e_seconds=0.2, decode_seconds=0.15)
    metrics.step("psd", wall_s=0.010, verify_s=0.008, draft_s=0.006, data_plane_s=0.001)
    s = samples(metrics)
    assert value(s, "vllm:prompt_tokens_total") == 7
    assert value(s, "vllm:generation_tokens_total") == 4
    assert value(s, "vllm:request_success_total", finished_reason="length") == 1
    assert value(s, "vllm:time_to_first_token_seconds_count") == 1
    assert value(s, "vllm:inter_token_latency_seconds_count") == 1
    assert abs(value(s, "vllm:request_time_per_output_token_seconds_sum") - 0.05) < 1e-9
    assert abs(value(s, "minedraft:overlap_efficiency_sum") - 0.8) < 1e-9
    assert value(s, "vllm:num_requests_running") == 3 and value(s, "vllm:num_requests_waiting") == 2
    assert value(s, "vllm:kv_cache_usage_perc") == 0.25
    assert value(s, "minedraft:mode", mode="psd") == 1 and value(s, "minedraft:mode", mode="ar") == 0
    assert value(s, "minedraft:batch_size", batch="0") == 2
    assert value(s, "minedraft:draft_link_info", transport="gloo") == 1
    assert value(s, "minedraft:speculation_fallback_active") == 0
    assert value(s, "minedraft:preemptions_total") == 2 and value(s, "minedraft:verifier_reconnects_total") == 1


def test_fallback_gauge_when_the_draft_is_gone() -> None:
    metrics = ServingMetrics("m", lambda: {**STATUS, "mode": "ar", "draft_connected": False})
    metrics.fell_back()
    s = samples(metrics)
    assert value(s, "minedraft:speculation_fallback_active") == 1
    assert value(s, "minedraft:speculation_fallbacks_total") == 1
    assert value(s, "minedraft:mode", mode="ar") == 1
