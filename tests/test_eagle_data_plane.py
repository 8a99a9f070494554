"""The target's hidden states an EAGLE head reads: captured right, and received on the draft side bit for bit."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.drafter import Proposal
from minedraft.engine.hidden_capture import CapturingRunner
from minedraft.engine.hidden_rows import HiddenRows
from minedraft.engine.loader import load_model
from minedraft.engine.verifier import Verifier
from minedraft.worker.data_frames import VerdictPayload
from minedraft.worker.data_plane import DRAFT_RANK, VERIFIER_RANK, DataPlane
from minedraft.worker.rendezvous import host_store

PROMPTS = [[5, 9, 13, 4], list(range(2, 60))]


def digest(rows: torch.Tensor) -> str:
    return hashlib.sha256(rows.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def draft_side(port: int, steps: int, queue: mp.Queue) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    plane = DataPlane(DRAFT_RANK, 0, store, "gloo", torch.device("cpu"))
    for _ in range(steps):
        got = plane.recv_verdict()
        assert got.hidden is not None
        queue.put((got.seq_ids, got.hidden.starts, got.hidden.counts, str(got.hidden.rows.dtype),
                   digest(got.hidden.rows)))
    plane.close()


def captured_steps(target: Path, taps: tuple[int, ...]) -> tuple[Verifier, list[VerdictPayload]]:
    """Two verify steps with random drafts: the prompts' prefill, then a window."""
    verifier = Verifier(CapturingRunner(load_model(target), 64, 4, "cpu", taps))
    for i, prompt in enumerate(PROMPTS):
        verifier.add(i, prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    payloads = []
    gen = torch.Generator().manual_seed(0)
    for step in range(2):
        drafts = torch.randint(0, 97, (2, 3), generator=gen)
        verdict = verifier.verify([0, 1], Proposal(drafts, None))
        payloads.append(VerdictPayload(step, [0, 1], verdict.tokens, verdict.accepted,
                                       verifier.runner.take_hidden([0, 1])))
    return verifier, payloads


def test_hidden_states_received_equal_the_targets(random_pair: tuple[Path, Path]) -> None:
    target, _ = random_pair
    _, payloads = captured_steps(target, (0, 1, 1))
    # A bf16 target's states travel as bf16 (half the bytes), not widened to float32.
    halved = payloads[1].hidden
    assert halved is not None
    payloads.append(VerdictPayload(2, payloads[1].seq_ids, payloads[1].tokens, payloads[1].accepted,
                                   HiddenRows(halved.starts, halved.counts, halved.rows.to(torch.bfloat16))))
    store = host_store("127.0.0.1", 0)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    peer = ctx.Process(target=draft_side, args=(store.port, len(payloads), queue))
    peer.start()
    plane = DataPlane(VERIFIER_RANK, 0, store, "gloo", torch.device("cpu"))
    try:
        for payload in payloads:
            plane.send_verdict(payload)
        for payload in payloads:
            assert payload.hidden is not None
            hidden = payload.hidden
            assert queue.get(timeout=60) == (payload.seq_ids, hidden.starts, hidden.counts, str(hidden.rows.dtype),
                                             digest(hidden.rows))
    finally:
        plane.close()
        peer.join(timeout=30)
    first, second = payloads[0].hidden, payloads[1].hidden
    assert first is not None and second is not None
    assert first.starts == [0, 0] and first.counts == [len(p) + 3 for p in PROMPTS]  # prompt + window
    assert second.counts == [4, 4] and first.rows.shape[1] == 3 * 64  # three taps of width h


def test_captured_states_are_the_targets_own(random_pair: tuple[Path, Path]) -> None:
    """EAGLE-1 reads the last (normed) hidden state, EAGLE-3 the residual stream entering its tap layers:
    the prefill's rows equal the reference implementation's."""
    target, _ = random_pair
    hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    for taps in ((), (0, 1, 1)):
        _, payloads = captured_steps(target, taps)
        hidden = payloads[0].hidden
        assert hidden is not None
        start, rows = hidden.row(1)
        prompt = PROMPTS[1]
        with torch.no_grad():
            ref = hf(torch.tensor([prompt]), output_hidden_states=True).hidden_states
        expected = ref[-1][0] if not taps else torch.cat([ref[i][0] for i in taps], -1)
        assert start == 0
        torch.testing.assert_close(rows[: len(prompt)], expected, rtol=1e-4, atol=1e-4)
