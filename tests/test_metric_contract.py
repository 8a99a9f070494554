"""The metrics endpoint pickers and autoscalers query, scraped from a running stack with Prometheus' own
parser: the Gateway API inference extension's picker (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, `vllm:cache_config_info{block_size, num_gpu_blocks}`), the workload-variant
autoscaler (the prompt/generation token histograms' sums and counts, the prefix-cache counters,
`vllm:request_success_total`), KEDA on queue depth, and the latency histograms dashboards read, every one with
`model_name`. The token histograms take one observation per finished request and sum to the token counters."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minedraft.cli.local_stack import LocalStack, StackConfig, free_port

PROMPT = [(7 * i) % 90 + 3 for i in range(40)]  # 2 full blocks a repeat can reuse
REQUESTS = 3
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def stack(random_pair, tmp_path_factory: pytest.TempPathFactory):
    cfg = StackConfig(target=str(random_pair[0]), draft=str(random_pair[1]), grpc_port=free_port(),
                      http_port=free_port(), k=3, num_blocks=256, log_dir=tmp_path_factory.mktemp("logs"))
    s = LocalStack(cfg)
    s.start(timeout=120)
    yield s
    s.stop()


def samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_every_metric_a_picker_or_an_autoscaler_queries_is_there_with_its_labels(stack: LocalStack) -> None:
    base = f"http://127.0.0.1:{stack.cfg.http_port}"
    for _ in range(REQUESTS):  # one after another: the repeats hit the first one's blocks
        reply = httpx.post(f"{base}/v1/completions", timeout=120, json={
            "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
        assert reply.status_code == 200, reply.text
    found = samples(httpx.get(f"{base}/metrics", timeout=10).text)
    model = found["vllm:num_requests_waiting"][0].labels["model_name"]
    wanted = ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
              "vllm:cache_config_info", "vllm:request_prompt_tokens_sum", "vllm:request_prompt_tokens_count",
              "vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_sum",
              "vllm:request_generation_tokens_count", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
              "vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
              "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
              "vllm:inter_token_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket"]
    missing = [name for name in wanted if name not in found]
    assert not missing, missing
    for name in wanted:
        assert all(s.labels.get("model_name") == model for s in found[name]), name
    info = found["vllm:cache_config_info"][0]
    assert info.value == 1 and int(info.labels["block_size"]) == 16 and int(info.labels["num_gpu_blocks"]) == 256

    def value(name: str) -> float:
        return sum(s.value for s in found[name])

    assert value("vllm:request_prompt_tokens_count") == REQUESTS == value("vllm:request_generation_tokens_count")
    assert value("vllm:request_prompt_tokens_sum") == value("vllm:prompt_tokens_total") == REQUESTS * len(PROMPT)
    assert value("vllm:request_generation_tokens_sum") == value("vllm:generation_tokens_total") == REQUESTS * MAX_TOKENS
    assert value("vllm:prefix_cache_queries_total") == REQUESTS * len(PROMPT)
    assert value("vllm:prefix_cache_hits_total") == (REQUESTS - 1) * 32  # floor(39 / 16) blocks per repeat
    assert any(s.labels.get("finished_reason") == "length" and s.value == REQUESTS
               for s in found["vllm:request_success_total"])
