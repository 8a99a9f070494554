"""Worker settings from flags, with environment variables as defaults (what a pod sets)."""

from __future__ import annotations

import argparse
import os

from minedraft.bundled import TINY_DRAFT, TINY_EAGLE, TINY_TARGET

BLAS_MODES = ("auto", "cublas", "cublaslt")  # engine/blas_plan.py (this module stays free of torch)
DRAFT_KINDS = ("model", "eagle")  # a draft model, or an EAGLE head (engine/eagle_pair.py)
DRAIN_MARGIN_S = 10.0  # workers wait this much beyond the drain grace: the manager's preStop and shutdown


def env(name: str, default: str) -> str:
    return os.environ.get(f"MINEDRAFT_{name}", default)


def nonnegative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def add_worker_flags(parser: argparse.ArgumentParser, role: str) -> None:
    model_default = str(TINY_TARGET if role == "verifier" else TINY_DRAFT)
    port_default = "50061" if role == "verifier" else "50062"
    parser.add_argument("--model", default=env("MODEL", model_default), help="HF model folder [MINEDRAFT_MODEL]")
    parser.add_argument("--host", default=env("HOST", "127.0.0.1"),
                        help="bind address of the control port and (verifier) the data-plane store; keep it "
                             "loopback (pod-local) unless the batch manager runs elsewhere [MINEDRAFT_HOST]")
    parser.add_argument("--port", type=int, default=int(env("PORT", port_default)),
                        help="control-plane gRPC port [MINEDRAFT_PORT]")
    parser.add_argument("--health-port", type=int, default=int(env("HEALTH_PORT", "0")),
                        help="also serve grpc.health.v1 (only) on this port, e.g. for kubelet probes of a "
                             "loopback control port; 0 = off [MINEDRAFT_HEALTH_PORT]")
    parser.add_argument("--health-host", default=env("HEALTH_HOST", "0.0.0.0"),
                        help="bind address of --health-port [MINEDRAFT_HEALTH_HOST]")
    parser.add_argument("--drain-grace-s", type=float, default=float(env("DRAIN_GRACE_S", "25")),
                        help="on SIGTERM, keep serving a connected batch manager while it drains (this long plus "
                             "a margin), then exit 0 [MINEDRAFT_DRAIN_GRACE_S]")
    parser.add_argument("--device", default=env("DEVICE", "cpu"), help="torch device [MINEDRAFT_DEVICE]")
    parser.add_argument("--dtype", default=env("DTYPE", "float32"), help="weight dtype [MINEDRAFT_DTYPE]")
    parser.add_argument("--num-blocks", type=int, default=int(env("NUM_BLOCKS", "4096")),
                        help="KV cache blocks [MINEDRAFT_NUM_BLOCKS]")
    parser.add_argument("--block-size", type=int, default=int(env("BLOCK_SIZE", "16")),
                        help="tokens per KV block [MINEDRAFT_BLOCK_SIZE]")
    parser.add_argument("--threads", type=int, default=int(env("THREADS", "0")),
                        help="torch CPU threads, 0 = torch default [MINEDRAFT_THREADS]")
    parser.add_argument("--cpu", default=env("CPU", ""),
                        help="pin this process to these CPU cores, e.g. 0 or 0-3 [MINEDRAFT_CPU]")
    parser.add_argument("--metrics-port", type=int, default=int(env("METRICS_PORT", "0")),
                        help="serve this worker's Prometheus /metrics here, 0 = off [MINEDRAFT_METRICS_PORT]")
    parser.add_argument("--metrics-host", default=env("METRICS_HOST", ""),
                        help="bind address of --metrics-port (default: --host) [MINEDRAFT_METRICS_HOST]")
    parser.add_argument("--trace-step-every", type=int, default=int(env("TRACE_STEP_EVERY", "100")),
                        help="with tracing on (OTEL_*), one step span per this many steps [MINEDRAFT_TRACE_STEP_EVERY]")
    parser.add_argument("--launch-ahead", choices=("auto", "on", "off"), default=env("LAUNCH_AHEAD", "auto"),
                        help="queue the next PSD step on the device before this one's result is read back: the "
                             "verifier's next verify, the draft's next drafts from a verdict still on the device "
                             "(verifier/ and draft_service/launch_ahead.py), and in sequential SD each verify before "
                             "its drafts reach the host (verifier/posted_drafts.py); auto = on for a GPU (the "
                             "verifier: a GPU, no tensor parallelism and a draft model; with an EAGLE head, either "
                             "worker only when on) "
                             "[MINEDRAFT_LAUNCH_AHEAD]")
    parser.add_argument("--blas", choices=BLAS_MODES, default=env("BLAS", "auto"),
                        help="the library of the half-precision projections on a GPU: auto = per GEMM shape of each "
                             "CUDA graph, the fastest of cuBLAS, cuBLASLt and (at most 128 rows) the Triton few-row "
                             "GEMM timed on this GPU as the graph is captured (eager steps: cuBLAS); cublas or "
                             "cublaslt = that one everywhere [MINEDRAFT_BLAS]")
    parser.add_argument("--capture-batch", type=nonnegative, default=env("CAPTURE_BATCH", "0"),
                        help="on a GPU, capture at start-up the CUDA graph of every steady step of up to this many "
                             "sequences (the policy's max_num_seqs) instead of on first use, where each new shape "
                             "stalls its step by tens of ms; each graph keeps its float32 logits (a verifier at 64 "
                             "sequences, k <= 8, 128k vocabulary: ~4.6 GB); 0 = on first use [MINEDRAFT_CAPTURE_BATCH]")
    parser.add_argument("--capture-k", type=nonnegative, default=env("CAPTURE_K", "8"),
                        help="with --capture-batch: for up to this many drafts per sequence per step (the policy's "
                             "k; 0 = plain decoding only) [MINEDRAFT_CAPTURE_K]")
    parser.add_argument("--draft-kind", choices=DRAFT_KINDS, default=env("DRAFT_KIND", "model"),
                        help="what drafts: a draft model, or an EAGLE head reading the target's hidden states, which "
                             "the verifier captures and sends with each verdict [MINEDRAFT_DRAFT_KIND]")
    if role == "draft":
        parser.add_argument("--target-model", default=env("TARGET_MODEL", str(TINY_TARGET)),
                            help="with --draft-kind eagle: the target's folder, whose embedding and lm_head the "
                                 "head (--model) shares by copy [MINEDRAFT_TARGET_MODEL]")
        parser.add_argument("--supervise", type=int, choices=(0, 1), default=int(env("SUPERVISE", "0")),
                            help="1 = run the draft service as a child of this process and restart it when it exits "
                                 "or stops answering health checks, so the container (and the pod's readiness) "
                                 "outlives it (worker/supervisor.py) [MINEDRAFT_SUPERVISE]")
        parser.add_argument("--startup-s", type=float, default=float(env("STARTUP_S", "1800")),
                            help="with --supervise: a draft service not serving within this many seconds of a "
                                 "start is restarted [MINEDRAFT_STARTUP_S]")
    if role == "verifier":
        parser.add_argument("--tp-size", type=int, default=int(env("TP_SIZE", "1")),
                            help="tensor-parallel ranks of the verifier [MINEDRAFT_TP_SIZE]")
        parser.add_argument("--tp-rank", type=int, default=int(env("TP_RANK", "0")),
                            help="this process's rank; rank 0 serves the control plane [MINEDRAFT_TP_RANK]")
        parser.add_argument("--tp-addr", default=env("TP_ADDR", "127.0.0.1:29650"),
                            help="host:port of rank 0's tensor-parallel rendezvous [MINEDRAFT_TP_ADDR]")
        parser.add_argument("--data-port", type=int, default=int(env("DATA_PORT", "0")),
                            help="data-plane rendezvous port, 0 = any free [MINEDRAFT_DATA_PORT]")
        parser.add_argument("--draft-head", default=env("DRAFT_HEAD", ""),
                            help="with --draft-kind eagle: the EAGLE head's folder, whose config says which hidden "
                                 "states to capture (default: --colocated-draft, else the bundled tiny head) "
                                 "[MINEDRAFT_DRAFT_HEAD]")
        parser.add_argument("--colocated-draft", default=env("COLOCATED_DRAFT", ""),
                            help="draft model folder to load on this verifier's (rank 0's) GPU and run standard SD "
                                 "without a draft service; empty = drafts come from a draft service "
                                 "[MINEDRAFT_COLOCATED_DRAFT]")


def pin_cpus(spec: str) -> None:
    """Restrict the process to the given cores ("0", "0,2", "0-3"); used to isolate benchmarks."""
    if not spec:
        return
    cores: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    os.sched_setaffinity(0, cores)


def draft_head_dir(args: argparse.Namespace) -> str:
    """The verifier's EAGLE head folder: --draft-head, else the colocated draft's, else the bundled one."""
    return args.draft_head or args.colocated_draft or str(TINY_EAGLE)
