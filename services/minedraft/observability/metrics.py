"""The batch manager's Prometheus metrics.

Names and meanings follow vLLM's (`vllm:*`), because dashboards, the Gateway API inference
extension's endpoint picker and the llm-d router already read them; what only batch-parallel
speculation has (two batches, overlap, fallback, the draft link) is under `minedraft:*`.
Counters and histograms are recorded as events happen; gauges are read from the live status
at scrape time, so they cannot drift from what /health says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# vLLM's buckets, so the same dashboard panels fit both servers.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5,
                1.0, 2.5)
OVERLAP_BUCKETS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
# Tokens per request: vLLM's 1-2-5 series (it stops at max_model_len; these go past any context).
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5))
MODES = ("psd", "sd", "ar")


class ServingMetrics:
    """Everything the batch manager exports on /metrics, in its own registry."""

    def __init__(self, model_name: str, status: Callable[[], Mapping[str, object]],
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        reg, model = self.registry, ["model_name"]

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, [*model, *labels], registry=reg)

        def histogram(name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ()) -> Histogram:
            return Histogram(name, doc, [*model, *labels], buckets=buckets, registry=reg)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished and running requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens streamed to clients.")
        self.request_success = counter("vllm:request_success", "Finished requests by finish reason.",
                                       ["finished_reason"])
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first output token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Time between two steps that gave a request tokens (one step may give several).",
                             ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Per request: decode time / (output tokens - 1).", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.", REQUEST_BUCKETS)
        # One observation per finished request, so the sums equal the token counters (autoscalers read both).
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Prompt tokens of each finished request.",
                                               TOKEN_BUCKETS)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Tokens generated for each finished request.", TOKEN_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Arrival to admission into a batch.",
                                    REQUEST_BUCKETS)
        self.num_drafts = counter("vllm:spec_decode_num_drafts", "Draft proposals judged (one per sequence and step).")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens judged.")
        self.accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.accepted_per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens by position in the draft (0 = first).", ["position"])
        self.step_time = histogram("minedraft:step_duration_seconds",
                                   "Wall time between two verified steps, by step kind.", STEP_BUCKETS, ["kind"])
        self.draft_time = histogram("minedraft:draft_step_seconds", "Draft service compute per step.", STEP_BUCKETS)
        self.verify_time = histogram("minedraft:verify_step_seconds", "Verifier compute per step.", STEP_BUCKETS)
        self.data_plane_time = histogram("minedraft:data_plane_seconds",
                                         "Time both workers spent in data-plane sends and waits per step.",
                                         STEP_BUCKETS)
        self.overlap = histogram("minedraft:overlap_efficiency",
                                 "PSD steps: max(draft, verify) / step wall time (1 = perfect overlap).",
                                 OVERLAP_BUCKETS)
        self.rebalance_moves = counter("minedraft:rebalance_moves", "Sequences moved between the two batches.")
        self.fallbacks = counter("minedraft:speculation_fallbacks",
                                 "Times speculation fell back to plain decoding (draft service lost).")
        # Tokens, as vLLM v1 counts them: a lookup queries the sequence's whole length, hits what it found cached.
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Target model's prefix cache: tokens looked up.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Target model's prefix cache: tokens found cached.")
        self.draft_prefix_queries = counter("minedraft:draft_prefix_cache_queries",
                                            "Draft model's prefix cache: tokens looked up.")
        self.draft_prefix_hits = counter("minedraft:draft_prefix_cache_hits",
                                         "Draft model's prefix cache: tokens found cached.")
        self.registry.register(_StatusGauges(model_name, status))
        # Children bound once: a labels() lookup per event would sit on the step loop's path.
        self._prompt = self.prompt_tokens.labels(model_name)
        self._generated = self.generation_tokens.labels(model_name)
        self._ttft = self.ttft.labels(model_name)
        self._itl = self.itl.labels(model_name)
        self._tpot = self.tpot.labels(model_name)
        self._e2e = self.e2e.labels(model_name)
        self._request_tokens = (self.request_prompt_tokens.labels(model_name),
                                self.request_generation_tokens.labels(model_name))
        self._queue = self.queue_time.labels(model_name)
        self._drafts = self.num_drafts.labels(model_name)
        self._draft_tokens = self.draft_tokens.labels(model_name)
        self._accepted = self.accepted_tokens.labels(model_name)
        self._verify = self.verify_time.labels(model_name)
        self._draft = self.draft_time.labels(model_name)
        self._data_plane = self.data_plane_time.labels(model_name)
        self._overlap = self.overlap.labels(model_name)
        self._prefix = (self.prefix_queries.labels(model_name), self.prefix_hits.labels(model_name))
        self._draft_prefix = (self.draft_prefix_queries.labels(model_name), self.draft_prefix_hits.labels(model_name))
        self._per_pos: dict[int, object] = {}
        self._step_kind: dict[str, object] = {}
        self._success: dict[str, object] = {}

    # ----- requests -------------------------------------------------------------------------

    def request_admitted(self, queue_seconds: float) -> None:
        self._queue.observe(queue_seconds)

    def tokens_streamed(self, count: int, since_previous: float | None) -> None:
        """`count` tokens reached a client; `since_previous` is None for the request's first tokens."""
        self._generated.inc(count)
        if since_previous is not None:
            self._itl.observe(since_previous)

    def first_token(self, seconds_since_arrival: float) -> None:
        self._ttft.observe(seconds_since_arrival)

    def request_finished(self, reason: str, prompt_tokens: int, output_tokens: int, e2e_seconds: float,
                         decode_seconds: float | None) -> None:
        self._prompt.inc(prompt_tokens)
        self._request_tokens[0].observe(prompt_tokens)
        self._request_tokens[1].observe(output_tokens)
        success = self._success.get(reason)
        if success is None:
            success = self._success[reason] = self.request_success.labels(self.model_name, reason)
        success.inc()  # type: ignore[attr-defined]
        self._e2e.observe(e2e_seconds)
        if decode_seconds is not None and output_tokens > 1:
            self._tpot.observe(decode_seconds / (output_tokens - 1))

    # ----- speculation and steps ------------------------------------------------------------

    def verdicts(self, drafted_per_seq: int, accepted: Sequence[int]) -> None:
        """One verify step: every sequence carried `drafted_per_seq` drafts (0: an AR step)."""
        if not drafted_per_seq or not accepted:
            return
        self._drafts.inc(len(accepted))
        self._draft_tokens.inc(drafted_per_seq * len(accepted))
        self._accepted.inc(sum(accepted))
        for position in range(drafted_per_seq):
            hits = sum(1 for a in accepted if a > position)
            if hits:
                child = self._per_pos.get(position)
                if child is None:
                    child = self._per_pos[position] = self.accepted_per_pos.labels(self.model_name, str(position))
                child.inc(hits)  # type: ignore[attr-defined]

    def step(self, kind: str, wall_s: float, verify_s: float, draft_s: float | None, data_plane_s: float) -> None:
        """A verified step; `draft_s` is the draft service's share of the same step when it drafted."""
        if wall_s > 0:
            child = self._step_kind.get(kind)
            if child is None:
                child = self._step_kind[kind] = self.step_time.labels(self.model_name, kind)
            child.observe(wall_s)  # type: ignore[attr-defined]
        self._verify.observe(verify_s)
        self._data_plane.observe(data_plane_s)
        if draft_s is not None:
            self._draft.observe(draft_s)
            if kind == "psd" and wall_s > 0:
                self._overlap.observe(min(1.0, max(draft_s, verify_s) / wall_s))

    def prefix_cache(self, queries: int, hits: int, draft: bool) -> None:
        """One worker step's prefix-cache lookups (tokens) on the target's cache or, with `draft`, the draft's."""
        if queries or hits:
            counted_queries, counted_hits = self._draft_prefix if draft else self._prefix
            counted_queries.inc(queries)
            counted_hits.inc(hits)

    def moved(self, sequences: int) -> None:
        if sequences:
            self.rebalance_moves.labels(self.model_name).inc(sequences)

    def fell_back(self) -> None:
        self.fallbacks.labels(self.model_name).inc()


class _StatusGauges(Collector):
    """Gauges read from the batch manager's status at scrape time."""

    def __init__(self, model_name: str, status: Callable[[], Mapping[str, object]]) -> None:
        self.model_name = model_name
        self.status = status

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.status()
        m = [self.model_name]

        def gauge(name: str, doc: str, value: float, labels: Sequence[str] = (), extra: Sequence[str] = ()) -> \
                GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model_name", *labels])
            family.add_metric([*m, *extra], value)
            return family

        yield gauge("vllm:num_requests_running", "Requests in the two batches.", float(s.get("running", 0)))
        yield gauge("vllm:num_requests_waiting", "Requests waiting for admission.", float(s.get("waiting", 0)))
        budget = float(s.get("block_budget", 0) or 0)
        used = float(s.get("reserved_blocks", 0) or 0)
        yield gauge("vllm:kv_cache_usage_perc",
                    "Fraction of KV blocks the running sequences may occupy at the next step (1 = full); cached "
                    "blocks no sequence holds count as free, as in vLLM.",
                    used / budget if budget else 0.0)
        yield _cache_config(m, s)
        k = float(s.get("k", 0))
        yield gauge("minedraft:k", "Draft tokens per speculative step.", k)
        mode = GaugeMetricFamily("minedraft:mode", "Current step mode (1 for the active one).",
                                 labels=["model_name", "mode"])
        for name in MODES:
            mode.add_metric([*m, name], 1.0 if s.get("mode") == name else 0.0)
        yield mode
        fallback = s.get("configured_mode") != "ar" and not s.get("draft_connected", False)
        yield gauge("minedraft:speculation_fallback_active",
                    "1 while speculation is configured but the draft service is unavailable (plain decoding, or "
                    "SD on the verifier's own draft model where it loaded one).",
                    1.0 if fallback else 0.0)
        sizes = s.get("batch_sizes") or [0, 0]
        batch = GaugeMetricFamily("minedraft:batch_size", "Sequences in each of the two batches.",
                                  labels=["model_name", "batch"])
        for index, size in enumerate(sizes):  # type: ignore[arg-type]
            batch.add_metric([*m, str(index)], float(size))
        yield batch
        for name, key, doc in (("minedraft:preemptions", "preemptions",
                                "Sequences preempted for KV space (requeued and recomputed)."),
                               ("minedraft:verifier_reconnects", "verifier_reconnects",
                                "Times the batch manager reconnected to a restarted verifier.")):
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric(m, float(s.get(key, 0) or 0))
            yield counter
        transport = str(s.get("draft_link_transport", "") or "none")
        yield gauge("minedraft:draft_link_info", "The transport of the draft <-> verifier data plane (label).",
                    1.0, ["transport"], [transport])


def _cache_config(model: Sequence[str], s: Mapping[str, object]) -> GaugeMetricFamily:
    """vLLM's info gauge: value 1, the settings in labels named and spelled as vLLM's ("16", "True"), plus
    model_name like every family here, so tools that size the cache as num_gpu_blocks x block_size work
    unchanged; num_gpu_blocks is the block budget both workers can hold."""
    prefix = s.get("prefix_cache")
    enabled = bool(prefix.get("enabled")) if isinstance(prefix, Mapping) else False
    labels = {"block_size": str(s.get("block_size", 0) or 0), "num_gpu_blocks": str(s.get("block_budget", 0) or 0),
              "enable_prefix_caching": str(enabled), "engine": "0"}
    family = GaugeMetricFamily("vllm:cache_config_info", "Information of the KV cache configuration.",
                               labels=["model_name", *labels])
    family.add_metric([*model, *labels.values()], 1.0)
    return family
