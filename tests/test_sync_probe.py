"""The sync probe's cell syntax and its report of where a synchronising call came from
(bench/gpu/sync_probe.py; the probe itself needs a CUDA device)."""

from __future__ import annotations

import traceback

from minedraft.bench.gpu.step_cells import Cell
from minedraft.bench.gpu.sync_probe import caller, parse_cells


def test_cells_name_mode_batch_k_and_sampling() -> None:
    assert parse_cells("ar:1,ar:64:penalties,psd:16,psd:16:6,verify:8:6:penalties") == [
        Cell("ar", 1, 0), Cell("ar", 64, 0, "penalties"), Cell("psd", 16, 4), Cell("psd", 16, 6),
        Cell("verify", 8, 6, "penalties")]


def test_a_sync_is_charged_to_the_innermost_project_frames() -> None:
    frames = [traceback.FrameSummary("/x/site-packages/torch/_tensor.py", 10, "item"),
              traceback.FrameSummary("/repo/services/minedraft/verifier/executor.py", 140, "handle_plan"),
              traceback.FrameSummary("/repo/services/minedraft/engine/logits_processing.py", 77, "rows"),
              traceback.FrameSummary("/x/site-packages/torch/_tensor.py", 20, "__setitem__")]
    assert caller(frames) == "logits_processing.py:77 rows <- executor.py:140 handle_plan"
    assert caller(frames[:1]) == "elsewhere"
