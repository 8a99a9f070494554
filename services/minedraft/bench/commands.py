"""`minedraft bench ...`: the command line over the benchmark modules.

    minedraft bench [flags]             AR vs standard SD in one process (ar_vs_sd.py)
    minedraft bench --peer vllm [flags] ours and vLLM side by side, AR and SD (vs_vllm.py, vllm_peer.py)
    minedraft bench psd [flags]         SD vs PSD through the three services (sd_vs_psd.py);
                                        `minedraft bench-psd` is the same command
    minedraft bench gpu [flags]         the GPU sweep (gpu/sweep.py)
    minedraft bench gpu-report FILE     re-render a sweep's results.json (gpu/report.py)
    minedraft bench kernels             time the Triton attention kernel (gpu/attention_kernels.py)
    minedraft bench observability       PSD with metrics on vs off (observability_overhead.py)
    minedraft bench prefix-cache        prefix caching on vs off over HTTP: TTFT, throughput (prefix_cache.py)
    minedraft bench chunked-prefill     running streams' chunk gaps while long prompts prefill, chunked vs
                                        unchunked (chunked_prefill.py)

A benchmark's module (and torch with it) is imported when its command runs, not when the
parser is built.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from minedraft.bench import flags

Runner = Callable[[argparse.Namespace], int]

NAMED = {  # name: (module with run(args), flags, help)
    "psd": ("minedraft.bench.sd_vs_psd", flags.add_sd_vs_psd_flags, "standard SD vs PSD through the three services"),
    "gpu": ("minedraft.bench.gpu.sweep", flags.add_gpu_sweep_flags,
            "the GPU sweep: AR / SD / PSD over acceptance, k and m (CUDA)"),
    "gpu-report": ("minedraft.bench.gpu.report", flags.add_gpu_report_flags,
                   "markdown tables and a plot from a GPU sweep's results.json"),
    "kernels": ("minedraft.bench.gpu.attention_kernels", flags.add_kernel_timing_flags,
                "decode/verify timing of the Triton attention kernel (CUDA)"),
    "observability": ("minedraft.bench.observability_overhead", flags.add_sd_vs_psd_flags,
                      "PSD through the services with the batch manager's metrics on vs off"),
    "prefix-cache": ("minedraft.bench.prefix_cache", flags.add_prefix_cache_flags,
                     "prefix caching on vs off through the services: shared-prefix and multi-turn chat TTFT"),
    "chunked-prefill": ("minedraft.bench.chunked_prefill", flags.add_chunked_prefill_flags,
                        "streams' inter-chunk gaps while long prompts prefill, chunked vs unchunked"),
}


def runner(module: str) -> Runner:
    def run(args: argparse.Namespace) -> int:
        return int(importlib.import_module(module).run(args) or 0)

    return run


def default_bench(args: argparse.Namespace) -> int:
    """`minedraft bench` without a name: AR vs SD, or ours vs vLLM side by side with `--peer vllm`."""
    module = "minedraft.bench.vs_vllm" if args.peer == "vllm" else "minedraft.bench.ar_vs_sd"
    return runner(module)(args)


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench", help="compare AR and speculative decoding on CPU or GPU; `bench psd|gpu|...` for the others",
        description="Without a benchmark name: AR vs standard SD in one process. Flags given before a "
                    "benchmark name belong to that default comparison.",
    )
    flags.add_ar_vs_sd_flags(bench)
    bench.set_defaults(run=default_bench)
    named = bench.add_subparsers(dest="benchmark", metavar="{" + ",".join(NAMED) + "}")
    for name, (module, add_flags, text) in NAMED.items():
        p = named.add_parser(name, help=text, description=text)
        add_flags(p)
        p.set_defaults(run=runner(module))
    alias = sub.add_parser("bench-psd", help="standard SD vs PSD through the three services (= bench psd)")
    flags.add_sd_vs_psd_flags(alias)
    alias.set_defaults(run=runner("minedraft.bench.sd_vs_psd"))
