"""The verdict probe's switch and table (bench/gpu/verdict_probe.py; its timing needs a GPU)."""

from __future__ import annotations

from minedraft.bench.gpu import verdict_probe
from minedraft.engine import rejection


def test_the_torch_variant_switches_the_kernel_off_and_back_on() -> None:
    shipped = rejection._greedy_on_cuda
    with verdict_probe.rule("torch"):
        assert rejection._greedy_on_cuda is not shipped and rejection._greedy_on_cuda(None, None, None) is None
    assert rejection._greedy_on_cuda is shipped
    with verdict_probe.rule("kernel"):
        assert rejection._greedy_on_cuda is shipped


def test_the_table_gives_the_host_ratio() -> None:
    row = {"batch": 16, "k": 4, "same_verdict": True, "torch_host_us": 80.0, "kernel_host_us": 20.0,
           "torch_gpu_us": 30.0, "kernel_gpu_us": 25.0}
    assert verdict_probe.table([row])[2] == "| 16 | 4 | 80.0 | 20.0 | 0.25 | 30.0 | 25.0 | True |"
