"""Launch-ahead for autoregressive steps: queue step i+1's decode before step i's verdict is read back.

An AR plan decodes one token per sequence. The next AR plan over the same batch feeds exactly the
token step i emits, at the position the host already knows (the row's length before step i's commit),
so its inputs are a slice of step i's verdict still on the device: nothing the host has to wait for.
Queued before step i's readback, the GPU runs i+1 right behind i while the host reads i back, commits
it, builds its event and waits for the next plan; the host's share of a step leaves the critical path.

The launched step must be what the ordinary path would run after the commit, token for token: it
decodes with the same forward, sampling tensors and acceptance rule as `Verifier.judge` does for rows
in the steady state (sampled rows too: their draws are keyed by position, which is the length plus
one), and commits later through `Verifier.commit`. Step i's commit keeps the KV block the launched step
writes (`hold`). Only the plain case is launched: the next plan is the next step, verifies the same
batch in the same order, adds nothing, prefills nothing, removes none of it, sends no verdict and
drafts nothing; no row asks for a grammar (it advances on the host between steps, as in PSD
launch-ahead: launch_ahead.py), and the runner captures no hidden states. Logits processing (penalties,
biases, masks) runs on the device with the uncommitted token as the last of each row's history, as a
verify slot counts the drafts before it, and rows asking for logprobs get them from the launched step's
logits as `judge` computes them, read back with its verdict.
"""

from __future__ import annotations

import torch

from minedraft.engine.readback import device_mark
from minedraft.engine.rejection import Verdict, verify_drafts
from minedraft.engine.runner import ModelRunner
from minedraft.engine.sampling import processed_probs
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2
from minedraft.verifier.device_rows import host_free
from minedraft.verifier.launch_ahead import LaunchedStep
from minedraft.worker.membership import apply_membership
from minedraft.worker.step_timing import timed


def ar_launchable(worker: Verifier, current: control_pb2.StepPlan, ids: list[int], nxt: control_pb2.StepPlan) -> bool:
    """Whether the next plan's AR step may be queued behind the current AR step over `ids`."""
    if nxt.step != current.step + 1 or nxt.with_drafts or nxt.add or nxt.prefill or nxt.send_verdict:
        return False
    if nxt.draft_batch or nxt.draft_here or list(nxt.verify_batch) != ids or not set(nxt.remove).isdisjoint(ids):
        return False
    if type(worker.runner).take_hidden is not ModelRunner.take_hidden:
        return False
    seqs = worker.seqs
    if any(s not in seqs for s in ids):
        return False
    if any(not host_free(seqs[s].params) for s in worker.featured.intersection(ids)):
        return False
    positions = worker.runner.config.max_position_embeddings
    if max(seqs[s].length for s in ids) + 1 > positions:
        return False
    alloc = worker.runner.allocator
    return sum(alloc.extra_blocks_needed(s, seqs[s].length + 1) for s in ids) <= alloc.num_free


def launch_ar(worker: Verifier, current: control_pb2.StepPlan, ids: list[int], tokens: torch.Tensor,
              nxt: control_pb2.StepPlan | None) -> LaunchedStep | None:
    """Queue the next plan's decode over `ids`, fed with `tokens` [B, 1] (the current step's verdict on the
    device), and its readback; None when the plan is not there yet or not launchable."""
    if nxt is None or not ar_launchable(worker, current, ids, nxt):
        return None
    event = control_pb2.WorkerEvent(step=nxt.step)
    timing = event.timing
    timing.batch = len(ids)
    with timed(timing, "compute_ms"):
        started = device_mark(worker.runner.device)
        apply_membership(worker, nxt)  # removals only (the plan adds and prefills nothing)
        verdict = decode_after(worker, ids, tokens[:, :1])
        readback = worker.read_back(verdict, started)
    return LaunchedStep(nxt, ids, event, readback, None, tokens=verdict.tokens)


def decode_after(worker: Verifier, ids: list[int], tokens: torch.Tensor) -> Verdict:
    """`Verifier.judge(ids, None)` as it would run once the step that emits `tokens` is committed: each
    row feeds its new token at its current length, and decides the token at length + 1."""
    runner = worker.runner
    states = [worker.seqs[s] for s in ids]
    starts = [st.length for st in states]
    logits = runner.forward_ids(ids, tokens, starts, [1] * len(ids), last_n=1)
    drafts = torch.zeros((len(ids), 0), dtype=torch.long, device=runner.device)
    featured = not worker.featured.isdisjoint(ids)
    raw = logits
    if featured:  # the uncommitted token is the last of each row's history
        logits = worker.processing.apply(logits, states, drafts, pending=tokens)
    sampling = worker.sampling(ids)
    positions = (None if sampling.all_greedy else
                 runner.to_device(torch.tensor([n + 1 for n in starts], dtype=torch.long)).unsqueeze(1))
    target_probs = logits if sampling.all_greedy else processed_probs(logits, sampling)
    verdict = verify_drafts(drafts, None, target_probs, logits, sampling, positions)
    if featured:
        worker.stage_logprobs(ids, raw, logits, verdict)
    return verdict


def held(launched: LaunchedStep | None) -> int:
    """KV positions past the committed ones a commit must keep: the one an AR step launched ahead writes."""
    return 1 if launched is not None and launched.tokens is not None else 0
