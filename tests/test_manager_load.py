"""The batch manager's CPU per token, measured against a stand-in verifier (bench/manager_load.py)."""

from __future__ import annotations

import json
from pathlib import Path

from minedraft.bench.manager_load import main


def test_the_manager_load_bench_runs_the_real_manager_and_counts_its_cpu(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    assert main(["--batch", "4", "--max-tokens", "24", "--repeats", "1", "--step-ms", "2", "--json-out", str(out)]) == 0
    for client in ("--stream", "--http"):
        sse = tmp_path / f"{client[2:]}.json"
        args = ["--batch", "4", "--max-tokens", "24", "--repeats", "1", "--step-ms", "2", "--stream-interval", "4"]
        assert main([*args, client, "--json-out", str(sse)]) == 0
        assert json.loads(sse.read_text())[0]["tokens"] == 4 * 24  # every token arrived, in chunks of 4
    (row,) = json.loads(out.read_text())
    assert row["tokens"] == 4 * 24  # every request ran to max_tokens through the real manager
    assert row["cpu_us_per_token"] > 0 and row["cpu_ms_per_step"] > 0
    assert row["ms_per_step"] >= 2.0  # a step is at least the stand-in verifier's wait
