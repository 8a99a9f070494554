"""Held-out loss, greedy speculative acceptance and sizes of the saved pair."""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import AutoTokenizer, LlamaForCausalLM

from minedraft.bench.tiny_pair.bpe_tokenizer import concatenate_with_eos, encode_documents
from minedraft.bench.tiny_pair.corpus import Corpus, SourceFile
from minedraft.bench.tiny_pair.models import count_parameters, load_saved_model

MAX_TOTAL_BYTES = 15 * 1024 * 1024


@dataclass
class ModelEval:
    """Held-out quality and size of one saved model."""

    params: int
    weights_mb: float
    dir_mb: float
    held_out_loss: float
    held_out_ppl: float


@dataclass
class AcceptanceEval:
    """Greedy speculative-decoding acceptance of the draft against the target."""

    k: int
    prompts: int
    prompt_tokens: int
    new_tokens: int
    sd_steps: int
    proposed: int
    accepted: int
    acceptance: float
    mean_accepted_length: float


@dataclass
class PairEval:
    """Everything ``--eval-only`` measures."""

    target: ModelEval
    draft: ModelEval
    acceptance: AcceptanceEval
    held_out_files: int
    held_out_tokens: int
    roundtrip_ok_files: int
    total_mb: float


@torch.no_grad()
def held_out_loss(model: LlamaForCausalLM, stream: torch.Tensor, seq_len: int, batch_size: int) -> float:
    """Mean next-token cross-entropy over non-overlapping windows of the held-out stream."""
    n_windows = (stream.numel() - 1) // seq_len
    total, count = 0.0, 0
    for first in range(0, n_windows, batch_size):
        idx = range(first, min(first + batch_size, n_windows))
        batch = torch.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in idx])
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum"
        )
        total += loss.item()
        count += batch[:, 1:].numel()
    return total / count


@torch.no_grad()
def greedy_tokens(model: LlamaForCausalLM, prefix: list[int], count: int) -> list[int]:
    """Greedy continuation of ``prefix`` by ``count`` tokens (KV-cached, EOS not special)."""
    out = model(input_ids=torch.tensor([prefix]), use_cache=True)
    tokens: list[int] = []
    while True:
        next_id = int(out.logits[0, -1].argmax())
        tokens.append(next_id)
        if len(tokens) == count:
            return tokens
        out = model(
            input_ids=torch.tensor([[next_id]]), past_key_values=out.past_key_values, use_cache=True
        )


def matching_prefix_length(proposal: list[int], reference: list[int]) -> int:
    """Number of leading proposal tokens equal to the reference tokens."""
    matches = 0
    for proposed, expected in zip(proposal, reference, strict=False):
        if proposed != expected:
            break
        matches += 1
    return matches


def simulate_speculative_decoding(
    target: LlamaForCausalLM, draft: LlamaForCausalLM, prompt: list[int], new_tokens: int, k: int
) -> tuple[int, int, int]:
    """Greedy SD on one prompt; returns (steps, accepted draft tokens, proposed draft tokens).

    The target's greedy continuation is the ground truth. Each step the draft
    proposes ``k`` tokens from the current prefix; the matching prefix is
    accepted and the target adds one correction/bonus token.
    """
    reference = greedy_tokens(target, prompt, new_tokens + k)
    position, steps, accepted, proposed = 0, 0, 0, 0
    while position < new_tokens:
        proposal = greedy_tokens(draft, prompt + reference[:position], k)
        matches = matching_prefix_length(proposal, reference[position : position + k])
        accepted += matches
        proposed += k
        steps += 1
        position += matches + 1
    return steps, accepted, proposed


def build_prompts(
    held_out_docs: list[list[int]], count: int, prompt_tokens: int, reserve: int, seed: int
) -> list[list[int]]:
    """``count`` prompts of ``prompt_tokens`` tokens from random offsets of held-out files."""
    rng = random.Random(seed)
    usable = [doc for doc in held_out_docs if len(doc) >= prompt_tokens + reserve]
    if not usable:
        raise RuntimeError("no held-out file is long enough for a prompt")
    prompts: list[list[int]] = []
    for i in range(count):
        doc = usable[i % len(usable)]
        start = rng.randrange(0, len(doc) - prompt_tokens - reserve + 1)
        prompts.append(doc[start : start + prompt_tokens])
    return prompts


def measure_acceptance(
    target: LlamaForCausalLM,
    draft: LlamaForCausalLM,
    prompts: list[list[int]],
    new_tokens: int,
    k: int,
) -> AcceptanceEval:
    """Aggregate greedy SD acceptance over all prompts."""
    steps = accepted = proposed = 0
    for prompt in prompts:
        s, a, p = simulate_speculative_decoding(target, draft, prompt, new_tokens, k)
        steps, accepted, proposed = steps + s, accepted + a, proposed + p
    return AcceptanceEval(
        k=k,
        prompts=len(prompts),
        prompt_tokens=len(prompts[0]),
        new_tokens=new_tokens,
        sd_steps=steps,
        proposed=proposed,
        accepted=accepted,
        acceptance=accepted / proposed,
        mean_accepted_length=(accepted + steps) / steps,
    )


def dir_size_mb(path: Path) -> float:
    """Total size of the files in a directory, in MB (10^6 bytes)."""
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / 1e6



def count_roundtrip_files(model_dir: Path, files: list[SourceFile]) -> int:
    """How many files survive decode(encode(text)) unchanged through AutoTokenizer."""
    hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ok = 0
    for f in files:
        ids = hf_tokenizer.encode(f.text, add_special_tokens=False, verbose=False)
        ok += hf_tokenizer.decode(ids) == f.text
    return ok


def evaluate_model(
    model: LlamaForCausalLM, model_dir: Path, stream: torch.Tensor, args: argparse.Namespace
) -> ModelEval:
    """Size and held-out loss of one saved model."""
    loss = held_out_loss(model, stream, args.seq_len, args.eval_batch_size)
    return ModelEval(
        params=count_parameters(model),
        weights_mb=(model_dir / "model.safetensors").stat().st_size / 1e6,
        dir_mb=dir_size_mb(model_dir),
        held_out_loss=loss,
        held_out_ppl=math.exp(loss),
    )


def evaluate_pair(args: argparse.Namespace, corpus: Corpus) -> PairEval:
    """Load both saved models in float32 and measure loss, acceptance and sizes."""
    target_dir, draft_dir = Path(args.target_dir), Path(args.draft_dir)
    tokenizer = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    held_out_docs = encode_documents(tokenizer, corpus.held_out)
    stream = concatenate_with_eos(held_out_docs)
    target, draft = load_saved_model(target_dir), load_saved_model(draft_dir)
    target_eval = evaluate_model(target, target_dir, stream, args)
    draft_eval = evaluate_model(draft, draft_dir, stream, args)
    prompts = build_prompts(
        held_out_docs, args.eval_prompts, args.prompt_tokens, args.new_tokens + args.k, args.seed
    )
    acceptance = measure_acceptance(target, draft, prompts, args.new_tokens, args.k)
    result = PairEval(
        target=target_eval,
        draft=draft_eval,
        acceptance=acceptance,
        held_out_files=len(corpus.held_out),
        held_out_tokens=stream.numel(),
        roundtrip_ok_files=count_roundtrip_files(target_dir, corpus.held_out),
        total_mb=dir_size_mb(target_dir) + dir_size_mb(draft_dir),
    )
    print_eval(result)
    return result


def print_eval(result: PairEval) -> None:
    """Print the measured numbers."""
    acc = result.acceptance
    for name, m in (("target", result.target), ("draft", result.draft)):
        print(
            f"[eval] {name}: {m.params:,} params, {m.weights_mb:.2f} MB weights, "
            f"held-out loss {m.held_out_loss:.4f} (ppl {m.held_out_ppl:.2f})",
            flush=True,
        )
    print(
        f"[eval] k={acc.k}: acceptance {acc.acceptance:.4f} ({acc.accepted}/{acc.proposed}), "
        f"mean accepted length {acc.mean_accepted_length:.3f} tokens/step over {acc.sd_steps} steps",
        flush=True,
    )
    print(
        f"[eval] tokenizer roundtrip {result.roundtrip_ok_files}/{result.held_out_files} held-out files; "
        f"total size {result.total_mb:.2f} MB",
        flush=True,
    )
    if result.total_mb * 1e6 > MAX_TOTAL_BYTES:
        print(f"[eval] WARNING: pair exceeds {MAX_TOTAL_BYTES / 1e6:.1f} MB", flush=True)
