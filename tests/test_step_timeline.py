"""The step timeline's bookkeeping on hand-made traces: kernel kinds, short and long gaps, and which host
phase a long gap is charged to (the innermost range open at each moment)."""

from __future__ import annotations

import pytest

from minedraft.bench.gpu.step_timeline import PhaseIndex, kernel_kind, merged, summarize


def kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def phase(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": "phase:" + name, "ts": ts, "dur": dur}


def test_kernel_kinds() -> None:
    assert kernel_kind("_paged_attention_kernel") == "attention"
    assert kernel_kind("_merge_splits_kernel") == "attention merge"
    assert kernel_kind("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT") == "gemm"
    assert kernel_kind("_fp8_gemm_kernel") == "fp8 gemm"
    assert kernel_kind("_add_rms_norm_kernel") == "norm"
    assert kernel_kind("void at::native::reduce_kernel<argmax>") == "sampling"
    assert kernel_kind("something_new") == "other"


def test_merged_unions_overlaps() -> None:
    assert merged([(5, 7), (0, 2), (1, 3), (7, 9)]) == [(0, 3), (5, 9)]


def test_innermost_phase_wins() -> None:
    index = PhaseIndex([(0, 100, "other"), (10, 40, "commit"), (20, 30, "block tables"), (50, 60, "input copies")])
    assert index.at(5) == "other"
    assert index.at(15) == "commit"
    assert index.at(25) == "block tables"
    assert index.at(35) == "commit"  # the inner range ended: back to its parent
    assert index.at(55) == "input copies"
    assert index.at(70) == "other"
    assert index.at(150) is None
    assert index.stack(25) == ["other", "commit", "block tables"]


def test_gaps_split_and_charged_to_the_host_phase() -> None:
    # Two steps: each is two kernels 2 us apart (a boundary gap), then 30 us of host work before the next.
    events = [
        kernel("nvjet_gemv", 0, 10), kernel("_paged_attention_kernel", 12, 5),   # step 1: 0..17
        phase("other", 10, 60), phase("commit", 17, 10), phase("input copies", 27, 20),
        kernel("nvjet_gemv", 47, 10), kernel("_paged_attention_kernel", 59, 5),  # step 2: 47..64
    ]
    t = summarize(events, steps=2)
    assert t.wall_us == pytest.approx(64 / 2)
    assert t.busy_us == pytest.approx(30 / 2)
    assert t.kernels == 2
    assert t.by_kind_us == {"gemm": pytest.approx(10.0), "attention": pytest.approx(5.0)}
    assert t.by_kind_count == {"gemm": pytest.approx(1.0), "attention": pytest.approx(1.0)}
    assert t.short_gaps_us == pytest.approx(4 / 2) and t.short_gaps == pytest.approx(1.0)
    assert t.long_gaps_us == pytest.approx(30 / 2)
    assert t.waited_on == {"input copies": pytest.approx(10.0), "commit": pytest.approx(5.0)}
    assert t.long_gaps == pytest.approx(0.5)
    assert t.largest == [(30, "other > input copies")]  # the phases open at the gap's middle, outermost first


def test_gap_with_no_host_range_is_unnamed() -> None:
    t = summarize([kernel("a_gemm", 0, 5), kernel("a_gemm", 25, 5)], steps=1)
    assert t.waited_on == {"unnamed": pytest.approx(20.0)}
    assert summarize([], steps=3).wall_us == 0.0


def test_cells_parse_and_the_report_names_every_kind_and_phase() -> None:
    from minedraft.bench.gpu.step_trace import parse_cells, report_lines

    cells = parse_cells("ar:1,verify:16:4,draft:64:6")
    assert [(c.mode, c.batch, c.k) for c in cells] == [("ar", 1, 0), ("verify", 16, 4), ("draft", 64, 6)]
    with pytest.raises(SystemExit, match="bad cell"):
        parse_cells("verify:16")  # a verify without k
    events = [kernel("nvjet_gemv", 0, 10), phase("commit", 10, 20), kernel("_paged_attention_kernel", 30, 5)]
    row = {"weights": "bf16", "mode": "ar", "batch": 1, "k": 0, **summarize(events, steps=1).as_dict()}
    text = "\n".join(report_lines([row]))
    header = text.splitlines()[0]
    assert "gemm" in header and "attention" in header  # a column per kernel kind seen
    assert "commit" in text and "20 commit" in text  # the long gap, charged to the host's commit
