"""The GPU sweep behind docs/benchmarks/gpu.md (`minedraft bench gpu`), its report, and the
attention kernels' timing (`minedraft bench kernels`). CUDA machines only."""
