"""`minedraft bench ...`: the command line over the benchmark modules.

    minedraft bench [flags]             AR vs standard SD in one process (ar_vs_sd.py)
    minedraft bench psd [flags]         SD vs PSD through the three services (sd_vs_psd.py);
                                        `minedraft bench-psd` is the same command
    minedraft bench gpu [flags]         the GPU sweep (gpu/sweep.py)
    minedraft bench gpu-report FILE     re-render a sweep's results.json (gpu/report.py)
    minedraft bench kernels             time the Triton attention kernel (gpu/attention_kernels.py)
"""

from __future__ import annotations

import argparse

from minedraft.bench import ar_vs_sd, sd_vs_psd
from minedraft.bench.gpu import attention_kernels, report, sweep

BENCHMARKS = {
    "psd": (sd_vs_psd, "standard SD vs PSD through the three services"),
    "gpu": (sweep, "the GPU sweep: AR / SD / PSD over acceptance, k and m (CUDA)"),
    "gpu-report": (report, "markdown tables and a plot from a GPU sweep's results.json"),
    "kernels": (attention_kernels, "decode/verify timing of the Triton attention kernel (CUDA)"),
}


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench", help="compare AR and speculative decoding on CPU or GPU; `bench psd|gpu|...` for the others",
        description="Without a benchmark name: AR vs standard SD in one process. Flags given before a "
                    "benchmark name belong to that default comparison.",
    )
    ar_vs_sd.add_flags(bench)
    bench.set_defaults(run=ar_vs_sd.run)
    named = bench.add_subparsers(dest="benchmark", metavar="{" + ",".join(BENCHMARKS) + "}")
    for name, (module, text) in BENCHMARKS.items():
        p = named.add_parser(name, help=text, description=module.__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_flags(p)
        p.set_defaults(run=module.run)
    alias = sub.add_parser("bench-psd", help="standard SD vs PSD through the three services (= bench psd)")
    sd_vs_psd.add_flags(alias)
    alias.set_defaults(run=sd_vs_psd.run)
