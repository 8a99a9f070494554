"""The few-row GEMM sweep's config filter: `--configs` narrows the Triton side by name, and the command line
hands it to the sweep beside the shared row and projection options."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


def test_configs_narrow_to_the_named_parts() -> None:
    from minedraft.bench.gpu.skinny_sweep import chosen
    from minedraft.engine.cuda.skinny_configs import configs_for

    at_80 = configs_for(80)
    split = chosen(at_80, ("k2", "k4"))
    assert split and all(c.split in (2, 4) and c.block_m == 128 for c in split)
    assert {c.name for c in split} == {c.name for c in at_80 if c.split > 1}
    assert chosen(at_80, ()) == at_80
    assert [c.name for c in chosen(at_80, ("dot128x32x128w8s3",))] == [
        "dot128x32x128w8s3", "dot128x32x128w8s3k2", "dot128x32x128w8s3k4"]


def test_the_command_line_hands_the_filter_to_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from minedraft.bench.gpu import skinny_sweep

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    seen: dict = {}

    def fake_measure(ms: list[int], shapes: list[str], configs: str = "") -> dict:
        seen.update(ms=ms, shapes=shapes, configs=configs)
        return {}

    monkeypatch.setattr(skinny_sweep, "measure", fake_measure)
    assert skinny_sweep.main(["--ms", "80", "--shapes", "o,down", "--configs", "k2,k4"]) == 0
    assert seen == {"ms": [80], "shapes": ["o", "down"], "configs": "k2,k4"}
    assert skinny_sweep.main(["--ms", "1"]) == 0 and seen["configs"] == ""  # every config
