"""The GPU sweep's timed cell (bench/gpu/placements.measure) on a CPU stack: the code a device call relies on
runs, reports per-batch anatomy, and returns the service's exact greedy outputs (device time is scarce; a
sweep that breaks there wastes it)."""

from __future__ import annotations

import json
import urllib.request

from minedraft.bench.gpu.placements import agreement, measure
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.sampling_params import SamplingParams
from tests.conftest import engine_from_folders


def test_measure_times_sd_auto_and_a_queue_and_reports_per_batch(tmp_path) -> None:
    prompts = [[(5 * i + j) % 200 + 3 for j in range(6)] for i in range(4)]
    engine = engine_from_folders(TINY_TARGET, None, "ar", num_blocks=512)
    expected = [r.output_ids for r in engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))]
    cfg = StackConfig(target=str(TINY_TARGET), draft=str(TINY_DRAFT), grpc_port=free_port(), http_port=free_port(),
                      k=2, num_blocks=512, log_dir=tmp_path)
    stack = LocalStack(cfg)
    stack.start(timeout=120)
    try:
        sd, sd_out = measure(stack, "sd", 2, prompts, 12, reps=1)
        auto, auto_out = measure(stack, "auto", 3, prompts, 12, reps=1)
        # a length per request, two at a time: the others queue for a place in the batch
        queued, queued_out = measure(stack, "sd", 2, prompts, [12, 5, 9, 3], reps=1, max_num_seqs=2)
        with urllib.request.urlopen(f"http://127.0.0.1:{stack.admin_port}/admin/policy", timeout=5) as reply:
            policy = json.loads(reply.read())
    finally:
        stack.stop()
    assert sd_out == expected and auto_out == expected
    assert queued_out == [row[:n] for row, n in zip(expected, [12, 5, 9, 3], strict=True)]
    assert policy["max_num_seqs"] == 2 and queued["concurrency"] == 4
    assert sd["graph_capture_ms"] == auto["graph_capture_ms"] == 0.0  # a CPU captures no CUDA graphs
    # adaptive k's plans over the timed run only: auto chose within 1..3, a fixed k chooses nothing
    assert auto["plans_by_k"] and set(auto["plans_by_k"]) <= {"1", "2", "3"} and sd["plans_by_k"] == {}
    assert agreement(auto_out, expected) == {"rows_equal_ar": 4, "rows_compared": 4, "agreement_with_ar": 1.0}
    for row in (sd, auto):
        assert row["tokens_per_s"] > 0 and row["steps"] > 0 and 0.0 <= row["acceptance"] <= 1.0
        assert row["verify_ms_per_batch"] >= row["verify_busy_ms"] > 0
    # sequential SD: the verifier has a batch in every other plan, so per batch is about twice per plan
    assert sd["verify_busy_fraction"] < 0.75 and sd["verify_ms_per_batch"] > 1.3 * sd["verify_busy_ms"]
