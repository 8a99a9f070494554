"""`minedraft bench --peer vllm` without vLLM installed: the command line, finding (or not finding)
the vLLM interpreter, a worker that cannot start, and the side-by-side measurement over real engines.

The run against vLLM itself is tests/test_vllm_fidelity.py (skipped where vLLM is not set up).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from minedraft.bench import vllm_peer
from minedraft.bench.vllm_peer import PeerConfig, VllmPeer, VllmUnavailable
from minedraft.bench.vs_vllm import SYSTEMS, measure, ours
from minedraft.cli.main import build_parser
from tests.conftest import engine_from_folders

PROMPTS = [[5, 9, 13], [7] * 11, [2, 3, 4, 5, 6, 7]]


def test_peer_flag_selects_the_vllm_comparison_and_keeps_the_default() -> None:
    parser = build_parser()
    args = parser.parse_args(["bench", "--peer", "vllm", "--batch-sizes", "1,16", "--threads", "2",
                              "--vllm-python", "/opt/v/bin/python", "--prompt-len", "24"])
    assert (args.peer, args.batch_sizes, args.threads, args.vllm_python, args.prompt_len) == (
        "vllm", "1,16", 2, "/opt/v/bin/python", 24)
    assert parser.parse_args(["bench"]).peer is None
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--peer", "tgi"])


def test_missing_interpreter_says_how_to_create_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_peer, "DEFAULT_VENV", tmp_path / "nowhere")
    monkeypatch.delenv(vllm_peer.PYTHON_ENV, raising=False)
    with pytest.raises(VllmUnavailable, match=r"setup_vllm_env\.sh"):
        vllm_peer.vllm_python()
    monkeypatch.setenv(vllm_peer.PYTHON_ENV, sys.executable)
    assert vllm_peer.vllm_python() == Path(sys.executable)
    with pytest.raises(VllmUnavailable, match="other"):  # an explicit path wins over the variable
        vllm_peer.vllm_python(str(tmp_path / "other"))


def test_worker_that_cannot_import_vllm_fails_with_its_log() -> None:
    """minedraft's own interpreter has no vLLM: the worker dies and the error carries why."""
    assert not vllm_peer.vllm_importable(Path(sys.executable))
    with pytest.raises(VllmUnavailable, match="No module named 'vllm'"):
        VllmPeer(PeerConfig("unused-target"), Path(sys.executable), start_timeout_s=120)


def test_measure_reports_speeds_ratios_and_greedy_identity(random_pair: tuple[Path, Path]) -> None:
    target, draft = random_pair
    ar = engine_from_folders(target, None, "ar", k=4)
    sd = engine_from_folders(target, draft, "sd", k=4)
    row = measure({"ours_ar": ours(ar), "vllm_ar": ours(ar), "ours_sd": ours(sd), "vllm_sd": ours(sd)},
                  PROMPTS, max_tokens=12, repeats=2)
    assert row["batch"] == len(PROMPTS)
    assert all(len(row[f"{name}_rounds"]) == 2 and row[f"{name}_tokens_per_s"] > 0 for name in SYSTEMS)
    assert all(row[f"{name}_tokens_per_cpu_s"] > 0 for name in SYSTEMS)
    assert row["ar_identical"] and row["sd_identical"] and row["sd_equals_ar"]
    # The ratio comes from the unrounded medians, which lie within 0.05 tok/s of the reported speeds.
    sd_speed, ar_speed = row["ours_sd_tokens_per_s"], row["ours_ar_tokens_per_s"]
    low, high = (sd_speed - 0.05) / (ar_speed + 0.05), (sd_speed + 0.05) / (ar_speed - 0.05)
    assert round(low, 3) <= row["ours_sd_over_ar"] <= round(high, 3)
    other = engine_from_folders(draft, None, "ar", k=4)  # a different model in the peer's place
    row = measure({"ours_ar": ours(ar), "vllm_ar": ours(other), "ours_sd": ours(sd), "vllm_sd": ours(sd)},
                  PROMPTS, max_tokens=12, repeats=1)
    assert not row["ar_identical"] and row["sd_identical"] and not row["sd_equals_ar"]
