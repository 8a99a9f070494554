"""Benchmarks: workloads, the gRPC/HTTP client, the in-process AR-vs-SD and the services SD-vs-PSD
comparisons, the GPU sweep, the synthetic model pair and the tiny pair's trainer.

`minedraft bench ...` (commands.py) is the command line over these modules.
"""
