"""GPU benchmark sweep for docs/benchmarks/gpu.md (runs on a 2-GPU H200 machine).

One invocation measures, side by side on the same machine:
- the device ceilings (device-to-device copy bandwidth, bf16 matmul rate);
- AR decode of the Llama-3-8B-shaped target at batch 1 against that bandwidth;
- in-process AR and standard SD with the draft on the target's GPU;
- through the real three services (verifier on GPU 0, draft on GPU 1, NCCL data plane):
  standard SD with the draft on its own GPU (sequential) and PSD, at equal total
  concurrency (m/2 + m/2 vs m) and the paper's way (m + m vs m);
- transformers `generate` and assisted generation at batch 1 on the same weights.
The synthetic pair (engine/synthetic.py) is calibrated to per-token greedy acceptance near
0.5, 0.7 and 0.9 first. Results: JSON, a markdown table and a PNG plot under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))

from minedraft.bundled import TINY_DRAFT, TINY_TARGET  # noqa: E402
from minedraft.cli.bench_psd import delta, fetch_status, put_policy, run_workload  # noqa: E402
from minedraft.cli.stack import LocalStack, StackConfig, free_port  # noqa: E402
from minedraft.core.sampling_params import SamplingParams  # noqa: E402
from minedraft.core.tokenizer import Tokenizer  # noqa: E402
from minedraft.engine.drafter import DraftWorker  # noqa: E402
from minedraft.engine.engine import EngineConfig, LLMEngine  # noqa: E402
from minedraft.engine.loader import load_model  # noqa: E402
from minedraft.engine.runner import ModelRunner  # noqa: E402
from minedraft.engine.verifier import TargetWorker  # noqa: E402

PROMPT_LEN = 32


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def spec(shape: str, role: str, alpha: float, draft_layers: int) -> str:
    return f"synthetic:{shape}:{role}:alpha={alpha}:draft_layers={draft_layers}"


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 2000, (count, PROMPT_LEN), generator=gen).tolist()


def time_cuda(fn, repeats: int = 10) -> float:
    """Median seconds of fn() measured with CUDA events."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1000.0)
    return statistics.median(samples)


def ceilings() -> dict[str, float]:
    n = 1 << 31  # 2 Gi bf16 elements = 4 GiB
    x = torch.randn(n, device="cuda:0", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    copy_s = time_cuda(lambda: y.copy_(x))
    a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    mm_s = time_cuda(lambda: a @ b)
    return {"copy_GBps": 2 * n * 2 / copy_s / 1e9, "bf16_TFLOPs": 2 * 8192**3 / mm_s / 1e12}


class InProcess:
    """Target (and draft) on cuda:0 in this process, for AR and same-GPU SD.

    One runner per model is shared by every engine made here, so CUDA graphs are captured
    once per (batch bucket, width) and reused across k and m.
    """

    def __init__(self, target: str, draft: str, num_blocks: int, draft_model=None) -> None:
        self.target = load_model(target, "cuda:0", torch.bfloat16)
        self.draft = draft_model or load_model(draft, "cuda:0", torch.bfloat16)
        self.tokenizer = Tokenizer(TINY_TARGET)
        self.target_worker = TargetWorker(ModelRunner(self.target, num_blocks, 16, "cuda:0"))
        self.draft_worker = DraftWorker(ModelRunner(self.draft, num_blocks, 16, "cuda:0"))

    def engine(self, mode: str, k: int, max_num_seqs: int) -> LLMEngine:
        cfg = EngineConfig(mode=mode, k=max(k, 1), max_num_seqs=max_num_seqs, device="cuda:0", dtype=torch.bfloat16)
        return LLMEngine(self.target_worker, self.draft_worker if mode == "sd" else None, self.tokenizer, cfg)

    def run(self, engine: LLMEngine, batch: list[list[int]], max_tokens: int) -> dict[str, float]:
        params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True) for _ in batch]
        engine.generate(batch[:2], [SamplingParams(max_tokens=8, ignore_eos=True) for _ in batch[:2]])  # warm
        engine.generate(batch, [SamplingParams(max_tokens=4, ignore_eos=True) for _ in batch])  # graphs
        torch.cuda.synchronize()
        start = time.perf_counter()
        reqs = engine.generate(batch, params)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        tokens = sum(len(r.output_ids) for r in reqs)
        drafted = sum(r.stats.drafted for r in reqs)
        return {
            "tokens_per_s": tokens / seconds,
            "seconds": seconds,
            "latency_per_request_s": seconds / len(batch),
            "acceptance": sum(r.stats.accepted for r in reqs) / drafted if drafted else 0.0,
            "tokens_per_step": tokens / sum(r.stats.steps for r in reqs),
            "outputs": [r.output_ids for r in reqs],
        }


def greedy_acceptance(inproc: InProcess, k: int = 4) -> float:
    eng = inproc.engine("sd", k, 16)
    return inproc.run(eng, prompts(16, seed=7), 32)["acceptance"]


def calibrate(shape: str, draft_layers: int, draft, targets: list[float],
              grid: tuple[float, ...] = (0.003, 0.008, 0.02, 0.05, 0.12)) -> dict[float, float]:
    """alpha for each target acceptance: measure a fixed alpha grid once, then interpolate
    acceptance linearly in log(alpha). The sweep reports the acceptance it then measures,
    not the goal."""
    import math

    points = []
    for alpha in grid:
        inproc = InProcess(spec(shape, "target", alpha, draft_layers), "", 512, draft_model=draft)
        points.append((alpha, greedy_acceptance(inproc)))
        del inproc
        torch.cuda.empty_cache()
        log(f"calibrate: alpha {alpha} -> acceptance {points[-1][1]:.3f}")
    chosen: dict[float, float] = {}
    for goal in targets:
        chosen[goal] = points[-1][0] if goal < points[-1][1] else points[0][0]
        for (a0, r0), (a1, r1) in itertools.pairwise(points):
            if min(r0, r1) <= goal <= max(r0, r1) and r0 != r1:
                t = (goal - r0) / (r1 - r0)
                chosen[goal] = round(math.exp(math.log(a0) + t * (math.log(a1) - math.log(a0))), 4)
                break
    return chosen


def ar_bandwidth(inproc: InProcess, context: int = 512, steps: int = 64) -> dict[str, float]:
    """Batch-1 decode step time against the bytes it must read (weights + KV)."""
    runner = ModelRunner(inproc.target, 256, 16, "cuda:0")
    runner.forward([0], [list(range(3, 3 + context))], [0], last_n=1)
    token = torch.tensor([[5]], device="cuda:0")
    pos = [context]

    def one_step() -> None:
        runner.forward_ids([0], token, pos, [1], last_n=1)

    def loop() -> None:
        """Greedy decode with the token fed back on the device: the host prepares step i+1
        while the GPU runs step i (no per-step synchronisation)."""
        tok = token
        for i in range(steps):
            logits = runner.forward_ids([0], tok, [context + i], [1], last_n=1)
            tok = logits[:, -1].argmax(-1, keepdim=True)

    step_s = time_cuda(one_step, repeats=steps)
    loop_s = time_cuda(loop, repeats=3) / steps
    profile = profile_steps(one_step)
    cfg = inproc.target.config
    weight_bytes = sum(p.numel() * p.element_size() for p in inproc.target.parameters())
    kv_bytes = 2 * cfg.num_layers * (context + 1) * cfg.num_kv_heads * cfg.head_dim * 2
    return {"step_ms": step_s * 1000, "bytes": weight_bytes + kv_bytes,
            "achieved_GBps": (weight_bytes + kv_bytes) / step_s / 1e9,
            "loop_step_ms": loop_s * 1000, "loop_GBps": (weight_bytes + kv_bytes) / loop_s / 1e9,
            "profile": profile}


def profile_steps(step, count: int = 10) -> str:
    """Where a decode step's time goes: top CUDA kernels and host ops over `count` steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(count):
            step()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)


def stack_run(stack: LocalStack, batch: list[list[int]], max_tokens: int) -> dict[str, float]:
    cfg = stack.cfg
    asyncio.run(run_workload(cfg.grpc_port, batch, 4))  # captures this size's graphs
    before = fetch_status(cfg.http_port)
    tokens, seconds = asyncio.run(run_workload(cfg.grpc_port, batch, max_tokens))
    per_step = delta(fetch_status(cfg.http_port), before)
    busiest = max(per_step.get("verify_compute_ms", 0.0), per_step.get("draft_compute_ms", 0.0))
    return {
        "tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "latency_per_request_s": seconds / len(batch),
        "steps": per_step["steps"],
        "acceptance": per_step["acceptance"],
        "step_ms": per_step.get("wall_ms", 0.0),
        "draft_ms": per_step.get("draft_compute_ms", 0.0),
        "verify_ms": per_step.get("verify_compute_ms", 0.0),
        "data_plane_ms": per_step.get("verify_send_ms", 0.0) + per_step.get("draft_send_ms", 0.0),
        "verify_wait_ms": per_step.get("verify_recv_wait_ms", 0.0),
        "draft_wait_ms": per_step.get("draft_recv_wait_ms", 0.0),
        "verify_plan_wait_ms": per_step.get("verify_plan_wait_ms", 0.0),
        "draft_plan_wait_ms": per_step.get("draft_plan_wait_ms", 0.0),
        "verify_control_ms": per_step.get("verify_control_ms", 0.0),
        "draft_control_ms": per_step.get("draft_control_ms", 0.0),
        "overlap_efficiency": busiest / per_step["wall_ms"] if per_step.get("wall_ms") else 0.0,
    }


def nccl_transport(log_dir: Path) -> str:
    found = set()
    for f in log_dir.glob("*.log"):
        for line in f.read_text(errors="ignore").splitlines():
            m = re.search(r"via (P2P/\S+|SHM\S*|NET/\S+)", line)
            if m:
                found.add(m.group(1))
    return ", ".join(sorted(found)) or "unknown"


def services_sweep(args: argparse.Namespace, alpha: float, log_dir: Path, ks: list[int], ms: list[int],
                   time_left) -> tuple[list[dict], str]:
    target, draft = pair_of(args, alpha)
    cfg = StackConfig(
        target=target,
        draft=draft,
        grpc_port=free_port(), http_port=free_port(), tp_size=args.tp_size,
        target_device=",".join(f"cuda:{r}" for r in range(args.tp_size)), draft_device=f"cuda:{args.tp_size}",
        mode="psd", k=ks[0], threads=4, max_num_seqs=2 * max(ms), num_blocks=args.num_blocks,
        dtype="bfloat16", data_plane_backend="nccl", log_dir=log_dir,
        extra_env={"NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P",
},
        tokenizer=str(TINY_TARGET),
    )
    stack = LocalStack(cfg)
    rows = []
    try:
        stack.start(timeout=300)
        for k in ks:
            for m in ms:
                if not time_left():
                    log("deadline reached: skipping the rest of the service sweep")
                    return rows, nccl_transport(log_dir)
                for name, mode, conc in (("SD-2GPU", "sd", m), ("PSD m/2+m/2", "psd", m), ("PSD m+m", "psd", 2 * m)):
                    put_policy(cfg.http_port, mode=mode, k=k, max_num_seqs=conc, pipeline_depth=args.pipeline_depth)
                    row = stack_run(stack, prompts(conc, seed=m), args.max_tokens)
                    row.update(config=name, k=k, m=m, concurrency=conc, gpus=args.tp_size + 1, alpha=alpha,
                               tp_size=args.tp_size, pipeline_depth=args.pipeline_depth)
                    log(f"alpha {alpha} k {k} m {m} {name}: {row['tokens_per_s']:.0f} tok/s, step "
                        f"{row['step_ms']:.2f} ms (draft {row['draft_ms']:.2f}, verify {row['verify_ms']:.2f}), "
                        f"overlap {row['overlap_efficiency']:.2f}")
                    rows.append(row)
    finally:
        stack.stop()
    return rows, nccl_transport(log_dir)


def host_profile(args: argparse.Namespace, alpha: float, k: int = 4, m: int = 16) -> dict[str, str]:
    """cProfile of the verifier's and the draft service's loop threads over one PSD m+m run:
    where each side's per-step host time goes (a separate run; profiling slows the host)."""
    import pstats

    prof_dir = Path(tempfile.mkdtemp(prefix="minedraft_prof_"))
    target, draft = pair_of(args, alpha)
    cfg = StackConfig(target=target, draft=draft, grpc_port=free_port(), http_port=free_port(),
                      target_device="cuda:0", draft_device="cuda:1", mode="psd", k=k, threads=4,
                      max_num_seqs=2 * m, num_blocks=args.num_blocks, dtype="bfloat16", data_plane_backend="nccl",
                      tokenizer=str(TINY_TARGET),
                      extra_env={"NCCL_NVLS_ENABLE": "0", "MINEDRAFT_PROFILE_DIR": str(prof_dir),
                                 "MINEDRAFT_PROFILE_FROM_STEP": "40"})
    stack = LocalStack(cfg)
    try:
        stack.start(timeout=300)
        row = stack_run(stack, prompts(2 * m, seed=5), args.max_tokens)
        stack.kill("batch-manager")  # ends the workers' streams: they write their stats
        time.sleep(3)
    finally:
        stack.stop()
    out = {"run": json.dumps({key: round(v, 3) for key, v in row.items() if isinstance(v, float)})}
    for f in sorted(prof_dir.glob("*.pstats")):
        buf = io.StringIO()
        stats = pstats.Stats(str(f), stream=buf)
        stats.sort_stats("tottime").print_stats(30)
        out[f.stem.split("-")[0]] = buf.getvalue()[-9000:]
    return out


def hf_peer(inproc: InProcess, max_tokens: int) -> dict[str, float]:
    """transformers generate and assisted generation at batch 1 on the same weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def hf_model(ours) -> LlamaForCausalLM:
        c = ours.config
        cfg = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                          num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                          num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                          max_position_embeddings=c.max_position_embeddings, rope_theta=c.rope.theta,
                          tie_word_embeddings=False)
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device("cuda:0"):
                model = LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(torch.float32)
        model.load_state_dict(ours.state_dict(), strict=True)  # every tensor, or no comparison
        return model.eval()

    target, draft = hf_model(inproc.target), hf_model(inproc.draft)
    ids = torch.tensor([prompts(1, seed=3)[0]], device="cuda:0")
    out: dict[str, float] = {}
    for name, extra in (("hf_ar", {}), ("hf_assisted", {"assistant_model": draft})):
        target.generate(ids, max_new_tokens=8, do_sample=False, **extra)
        torch.cuda.synchronize()
        start = time.perf_counter()
        gen = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                              min_new_tokens=max_tokens, do_sample=False, pad_token_id=0, **extra)
        torch.cuda.synchronize()
        out[f"{name}_tokens_per_s"] = (gen.shape[1] - ids.shape[1]) / (time.perf_counter() - start)
        out[f"{name}_tokens"] = gen[0, ids.shape[1]:].tolist()
    del target, draft
    torch.cuda.empty_cache()
    return out


def pair_of(args: argparse.Namespace, alpha: float) -> tuple[str, str]:
    """(target, draft) for an alpha; alpha < 0 stands for the bundled tiny pair."""
    if alpha < 0:
        return str(TINY_TARGET), str(TINY_DRAFT)
    return spec(args.shape, "target", alpha, args.draft_layers), spec(args.shape, "draft", alpha, args.draft_layers)


def inprocess_sweep(args: argparse.Namespace, goal: float, alpha: float, results: dict, ks: list[int],
                    ms: list[int], synthetic_draft) -> list[dict]:
    rows: list[dict] = []
    # The synthetic draft is the same model at every alpha (alpha scales only target layers).
    inproc = InProcess(*pair_of(args, alpha), args.num_blocks, draft_model=synthetic_draft if alpha >= 0 else None)
    if goal == args.full_grid and alpha >= 0:
        results["ar_bandwidth"] = ar_bandwidth(inproc)
        log(f"AR batch-1 bandwidth: {results['ar_bandwidth']}")
        if not args.skip_hf:
            results["batch1"] = batch1_comparison(inproc, args.max_tokens)
            log(f"batch 1: {results['batch1']}")
    for m in ms:
        ar = inproc.run(inproc.engine("ar", 0, m), prompts(m, seed=m), args.max_tokens)
        ar.update(config="AR", k=0, m=m, concurrency=m, gpus=1, alpha=alpha)
        rows.append(ar)
        for k in ks:
            sd = inproc.run(inproc.engine("sd", k, m), prompts(m, seed=m), args.max_tokens)
            sd.update(config="SD-1GPU", k=k, m=m, concurrency=m, gpus=1, alpha=alpha)
            sd["greedy_agreement_with_ar"] = statistics.mean(
                sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
                for a, b in zip(sd["outputs"], ar["outputs"], strict=True))
            rows.append(sd)
            log(f"alpha {alpha} m {m} k {k}: AR {ar['tokens_per_s']:.0f}, SD-1GPU {sd['tokens_per_s']:.0f} tok/s, "
                f"acceptance {sd['acceptance']:.3f}, agreement {sd['greedy_agreement_with_ar']:.3f}")
    for row in rows:
        row.pop("outputs", None)
    return rows


def batch1_comparison(inproc: InProcess, max_tokens: int) -> dict[str, object]:
    peer = hf_peer(inproc, max_tokens)
    ours = inproc.run(inproc.engine("sd", 4, 1), prompts(1, seed=3), max_tokens)
    ours_ar = inproc.run(inproc.engine("ar", 0, 1), prompts(1, seed=3), max_tokens)
    return {
        "hf_ar_tokens_per_s": peer["hf_ar_tokens_per_s"],
        "hf_assisted_tokens_per_s": peer["hf_assisted_tokens_per_s"],
        "ours_ar_tokens_per_s": ours_ar["tokens_per_s"],
        "ours_sd_k4_tokens_per_s": ours["tokens_per_s"],
        "hf_ar_matches_ours_ar": peer["hf_ar_tokens"] == ours_ar["outputs"][0],
        "greedy_agreement_sd_vs_ar": sum(a == b for a, b in zip(ours["outputs"][0], ours_ar["outputs"][0],
                                                              strict=True)) / max_tokens,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--acceptance", default="0.5,0.7,0.9")
    p.add_argument("--alphas", default="", help="skip calibration: comma list matching --acceptance")
    p.add_argument("--ks", default="2,4,6")
    p.add_argument("--ms", default="8,16,32,64")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-blocks", type=int, default=2048)
    p.add_argument("--full-grid", type=float, default=0.7, help="acceptance level that gets the whole k x m grid")
    p.add_argument("--small-ks", default="4", help="k values at the other acceptance levels")
    p.add_argument("--small-ms", default="16,64", help="m values at the other acceptance levels")
    p.add_argument("--deadline-s", type=float, default=1e9, help="start no new phase after this many seconds")
    p.add_argument("--tp-size", type=int, default=1,
                   help="target ranks for the services half: GPUs 0..tp-1 verify, GPU tp drafts")
    p.add_argument("--skip-inprocess", action="store_true", help="only the three-service half")
    p.add_argument("--skip-services", action="store_true")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--pipeline-depth", type=int, default=2, help="plans in flight ahead of the verifier")
    p.add_argument("--profile-host", action="store_true", help="finish with a cProfile'd PSD run (k=4, m=16)")
    p.add_argument("--tiny", action="store_true", help="also run the bundled tiny pair (k=4, --small-ms)")
    args = p.parse_args()
    args.ks = [int(x) for x in args.ks.split(",")]
    args.ms = [int(x) for x in args.ms.split(",")]
    args.small_ks = [int(x) for x in args.small_ks.split(",")]
    args.small_ms = [int(x) for x in args.small_ms.split(",")]
    started = time.monotonic()

    def time_left() -> bool:
        return time.monotonic() - started < args.deadline_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {"args": {k: v for k, v in vars(args).items() if k != "out"}}
    log(f"torch {torch.__version__}, {torch.cuda.device_count()} GPUs: {torch.cuda.get_device_name(0)}")
    results["topology"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout
    results["ceilings"] = ceilings()
    log(f"ceilings: {results['ceilings']}")
    goals = [float(x) for x in args.acceptance.split(",")]
    needs_draft = not (args.alphas and args.skip_inprocess)
    synthetic_draft = (load_model(spec(args.shape, "draft", 0.0, args.draft_layers), "cuda:0", torch.bfloat16)
                       if needs_draft else None)
    if args.alphas:
        alphas = dict(zip(goals, [float(x) for x in args.alphas.split(",")], strict=True))
    else:
        alphas = calibrate(args.shape, args.draft_layers, synthetic_draft, goals)
    results["alphas"] = {str(k): v for k, v in alphas.items()}
    if args.tiny:
        alphas["tiny"] = -1.0  # the bundled pair, last: its acceptance is what it is
    inproc_rows: list[dict] = []

    def grid(goal: float) -> tuple[list[int], list[int]]:
        if goal == "tiny":
            return [4], args.small_ms
        return (args.ks, args.ms) if goal == args.full_grid else (args.small_ks, args.small_ms)

    service_rows: list[dict] = []
    transports: dict[str, str] = {}
    # The level with the full grid goes first, so a deadline cuts the small grids, not it.
    for goal in sorted(alphas, key=lambda g: g != args.full_grid):
        alpha = alphas[goal]
        if not time_left():
            log(f"deadline reached: acceptance {goal} not measured")
            break
        try:
            if not args.skip_inprocess:
                inproc_rows += inprocess_sweep(args, goal, alpha, results, *grid(goal), synthetic_draft)
        except Exception as exc:  # keep what was measured; say what broke
            log(f"in-process sweep failed at alpha {alpha}: {exc!r}")
            results.setdefault("errors", []).append(f"inprocess alpha {alpha}: {exc!r}")
        torch.cuda.empty_cache()
        results["inprocess"] = inproc_rows
        (out / "results.json").write_text(json.dumps(results, indent=1))
        if args.skip_services or not time_left():
            continue
        log_dir = Path(tempfile.mkdtemp(prefix=f"minedraft_logs_alpha{alpha}_"))  # fresh: NCCL lines of this run only
        try:
            rows, transport = services_sweep(args, alpha, log_dir, *grid(goal), time_left)
            service_rows += rows
            transports[str(alpha)] = transport
        except Exception as exc:
            log(f"service sweep failed at alpha {alpha}: {exc!r}")
            tails = {f.name: f.read_text(errors="ignore").splitlines()[-25:] for f in log_dir.glob("*.log")}
            results.setdefault("errors", []).append({"services": alpha, "error": repr(exc), "logs": tails})
        results["services"] = service_rows
        results["nccl_transport"] = transports
        (out / "results.json").write_text(json.dumps(results, indent=1))
    if not args.skip_services and args.profile_host and alphas:
        try:
            results["host_profile"] = host_profile(args, alphas.get(args.full_grid, next(iter(alphas.values()))))
            log(f"host profile: {results['host_profile'].get('run')}")
        except Exception as exc:
            results.setdefault("errors", []).append(f"host profile: {exc!r}")
        (out / "results.json").write_text(json.dumps(results, indent=1))
    log(f"NCCL transport: {transports}")
    from gpu_report import report

    log(f"report: {report(results, out)}")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
