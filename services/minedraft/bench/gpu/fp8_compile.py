"""Compile the FP8 sweep's kernels ahead, in worker processes, into Triton's disk cache.

Triton compiles each kernel variant once (about a second, mostly single-threaded), so the sweep's
~200 variants would take most of its budget in one process. Workers launch each distinct variant
once on empty tensors of the real shapes (the same specialization the timed launches get), and the
tuner's own launches then load them from the cache. Anything a worker misses, the tuner compiles
itself; a worker's failure only costs time.
"""

from __future__ import annotations

import multiprocessing
import os
import time

from minedraft.bench.gpu import fp8_space as space
from minedraft.engine.cuda.fp8_tiles import Tile

Job = tuple[str, int, int, int, int, Tile]  # scheme, n, k, m, chunks, tile


def sweep_jobs(schemes: list[str], sms: int, min_m: int = 1) -> list[Job]:
    """One launch per distinct kernel the sweep will time (buckets from min_m), prefill-sized tiles last."""
    seen: set[tuple] = set()
    jobs: list[Job] = []
    for m in (b for b in space.M_BUCKETS if b >= min_m):
        for scheme in schemes:
            for n, k in space.shapes_8b().values():
                for chunks in space.chunk_choices(n, k, sms):
                    for tile in space.tiles_for(scheme, m):
                        for split in space.split_tiles(chunks, tile, n, m, sms):
                            keys = space.kernel_keys(scheme, chunks, split)
                            if not seen.issuperset(keys):
                                seen.update(keys)
                                jobs.append((scheme, n, k, m, chunks, split))
    return jobs


def _compile_one(job: Job) -> bool:
    import torch

    from minedraft.engine.cuda.fp8_gemm import fp8_gemm_with
    from minedraft.engine.fp8_weights import Fp8Weight

    scheme, n, k, m, chunks, tile = job
    try:
        scale_shape = (-(-n // 128), -(-k // 128)) if scheme == "block" else (n, 1)
        weight = Fp8Weight(torch.empty((n, k), dtype=torch.float8_e4m3fn, device="cuda"),
                           torch.ones(scale_shape, device="cuda"), scheme, 128 if scheme == "block" else 1)
        fp8_gemm_with(torch.zeros((m, k), dtype=torch.bfloat16, device="cuda"), weight, chunks, tile)
        torch.cuda.synchronize()
        return True
    except Exception:  # the tuner meets the same error and records it
        return False


def precompile(schemes: list[str], sms: int, workers: int, deadline: float, min_m: int = 1) -> int:
    """Compile the sweep's kernels in `workers` processes until done or `deadline` (time.monotonic());
    returns how many compiled."""
    jobs = sweep_jobs(schemes, sms, min_m)
    workers = min(workers, len(jobs), max(1, (os.cpu_count() or 2) - 2))
    if workers <= 0 or not jobs:
        return 0
    pool = multiprocessing.get_context("spawn").Pool(workers)
    done = 0
    try:
        results = pool.imap_unordered(_compile_one, jobs)
        for _ in jobs:
            done += bool(results.next(timeout=max(0.1, deadline - time.monotonic())))
    except (multiprocessing.TimeoutError, StopIteration):
        pass
    except Exception as exc:  # a broken pool: the tuner compiles what is left itself
        print(f"precompile stopped: {type(exc).__name__}: {exc}", flush=True)
    finally:
        pool.terminate()
        pool.join()
    return done
