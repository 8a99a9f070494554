"""Train the tiny target + draft Llama pair bundled with minedraft.

Why this exists: minedraft's tests, demos and CI need a real speculative-decoding
model pair that is small enough to ship in the repository (< 15 MB), runs on a
CPU, and was produced without network access.  This script builds that pair
reproducibly from data every machine has offline -- the Python standard library
sources -- so anyone can regenerate (or audit) the bundled weights:

1. collect the stdlib ``*.py`` files, hold out ~2 % of them by path hash;
2. train a 2048-token byte-level BPE tokenizer on the training files;
3. train a 4-layer Llama target on random 256-token windows;
4. distil a 1-layer Llama draft from the target's logits;
5. save both in Hugging Face format (bfloat16 safetensors + tokenizer files);
6. measure held-out loss and greedy draft acceptance at k=4, and write
   ``services/minedraft/assets/TINY_PAIR.md``.

Run ``python scripts/train_tiny_pair.py`` to reproduce the bundled pair, or add
``--eval-only`` to re-measure the saved models.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import random
import shlex
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS_DIR = REPO_ROOT / "services" / "minedraft" / "assets"
EOS_TOKEN = "<|endoftext|>"
EOS_ID = 0
VOCAB_SIZE = 2048
MAX_POSITIONS = 1024
SKIPPED_DIR_NAMES = frozenset({"test", "tests", "site-packages"})
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MAX_TOTAL_BYTES = 15 * 1024 * 1024


# --------------------------------------------------------------------------- corpus


@dataclass(frozen=True)
class SourceFile:
    """One stdlib source file, identified by its path relative to the stdlib root."""

    rel_path: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """The deterministic train / held-out split of the stdlib sources."""

    train: list[SourceFile]
    held_out: list[SourceFile]


def is_skipped_path(rel_parts: tuple[str, ...]) -> bool:
    """Return True for files under test suites or third-party packages."""
    return any(part in SKIPPED_DIR_NAMES for part in rel_parts[:-1])


def is_held_out(rel_path: str, fraction: float) -> bool:
    """Deterministically assign ~``fraction`` of files to the held-out set by path hash."""
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def collect_stdlib_files(stdlib_dir: Path) -> list[SourceFile]:
    """Read every UTF-8 ``*.py`` file of the stdlib, sorted by relative path."""
    files: list[SourceFile] = []
    for path in sorted(stdlib_dir.rglob("*.py"), key=lambda p: p.relative_to(stdlib_dir).as_posix()):
        rel = path.relative_to(stdlib_dir)
        if is_skipped_path(rel.parts) or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            files.append(SourceFile(rel.as_posix(), text))
    return files


def split_corpus(files: list[SourceFile], held_out_fraction: float) -> Corpus:
    """Split files into training and held-out sets by hash of their relative path."""
    train = [f for f in files if not is_held_out(f.rel_path, held_out_fraction)]
    held_out = [f for f in files if is_held_out(f.rel_path, held_out_fraction)]
    return Corpus(train=train, held_out=held_out)


def load_corpus(held_out_fraction: float) -> Corpus:
    """Load and split the stdlib corpus of the running interpreter."""
    stdlib_dir = Path(sysconfig.get_paths()["stdlib"])
    corpus = split_corpus(collect_stdlib_files(stdlib_dir), held_out_fraction)
    train_mb = sum(len(f.text) for f in corpus.train) / 1e6
    print(
        f"corpus: {stdlib_dir} -> {len(corpus.train)} train files ({train_mb:.1f} M chars), "
        f"{len(corpus.held_out)} held-out files",
        flush=True,
    )
    return corpus


# ------------------------------------------------------------------------ tokenizer


def train_bpe_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE whose id 0 is ``<|endoftext|>``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if tokenizer.token_to_id(EOS_TOKEN) != EOS_ID:
        raise RuntimeError(f"{EOS_TOKEN} must have id {EOS_ID}")
    return tokenizer


def tokenizer_config() -> dict[str, Any]:
    """The ``tokenizer_config.json`` that lets AutoTokenizer load ``tokenizer.json``."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": EOS_TOKEN,
        "model_max_length": MAX_POSITIONS,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(EOS_ID): {
                "content": EOS_TOKEN,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
        },
    }


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    write_json(out_dir / "tokenizer_config.json", tokenizer_config())
    special = {"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": EOS_TOKEN}
    write_json(out_dir / "special_tokens_map.json", special)


def encode_documents(tokenizer: Tokenizer, files: list[SourceFile]) -> list[list[int]]:
    """Token ids of each file, without special tokens."""
    encodings = tokenizer.encode_batch([f.text for f in files], add_special_tokens=False)
    return [enc.ids for enc in encodings]


def concatenate_with_eos(documents: list[list[int]]) -> torch.Tensor:
    """One token stream: ``<eos> doc1 <eos> doc2 ...`` (eos separates documents)."""
    stream: list[int] = []
    for doc in documents:
        stream.append(EOS_ID)
        stream.extend(doc)
    stream.append(EOS_ID)
    return torch.tensor(stream, dtype=torch.long)


# --------------------------------------------------------------------------- models


def build_llama_config(num_layers: int) -> LlamaConfig:
    """The shared architecture of target and draft; only the depth differs."""
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=688,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
        attention_dropout=0.0,
        attn_implementation="sdpa",
    )


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameter count (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def init_draft_from_target(draft: LlamaForCausalLM, target: LlamaForCausalLM) -> None:
    """Start the draft from the target's (tied) token embedding and final norm."""
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.model.norm.weight.copy_(target.model.norm.weight)


def save_model(model: LlamaForCausalLM, tokenizer: Tokenizer, out_dir: Path) -> None:
    """Save bfloat16 safetensors weights, config, generation config and tokenizer."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.safetensors"):
        stale.unlink()
    bf16_model = model.to(torch.bfloat16)
    bf16_model.config.dtype = torch.bfloat16
    bf16_model.save_pretrained(out_dir)
    add_legacy_config_keys(out_dir / "config.json")
    save_tokenizer(tokenizer, out_dir)
    model.to(torch.float32)


def add_legacy_config_keys(config_path: Path) -> None:
    """Also write ``torch_dtype`` / ``rope_theta`` for loaders predating transformers v5."""
    config = json.loads(config_path.read_text())
    config["torch_dtype"] = "bfloat16"
    config["rope_theta"] = config.get("rope_parameters", {}).get("rope_theta", 10000.0)
    write_json(config_path, config)


# ------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainSettings:
    """Optimiser and schedule settings of one training phase."""

    steps: int
    batch_size: int
    seq_len: int
    peak_lr: float
    warmup_steps: int
    min_lr_ratio: float
    weight_decay: float
    log_every: int
    seed: int


@dataclass
class PhaseResult:
    """What one training phase measured."""

    steps: int
    seconds: float
    final_loss: float
    tokens_seen: int


def cosine_lr_factor(step: int, settings: TrainSettings) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio`` of the peak LR."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * cosine


def build_optimizer(
    model: torch.nn.Module, settings: TrainSettings
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with weight decay on matrices only, plus the warmup+cosine schedule."""
    matrices = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": matrices, "weight_decay": settings.weight_decay},
            {"params": vectors, "weight_decay": 0.0},
        ],
        lr=settings.peak_lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_lr_factor(step, settings)
    )
    return optimizer, scheduler


def sample_windows(
    stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> torch.Tensor:
    """Random ``seq_len + 1``-token windows of the stream (inputs plus shifted labels)."""
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of next-token logits against labels."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def distillation_loss(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    labels: torch.Tensor,
    ce_weight: float,
) -> torch.Tensor:
    """``(1 - w) * KL(target || draft) + w * CE(draft, data)``, averaged per token."""
    vocab = draft_logits.size(-1)
    draft_logp = F.log_softmax(draft_logits.reshape(-1, vocab), dim=-1)
    target_logp = F.log_softmax(target_logits.reshape(-1, vocab), dim=-1)
    kl = F.kl_div(draft_logp, target_logp, log_target=True, reduction="batchmean")
    ce = F.nll_loss(draft_logp, labels.reshape(-1))
    return (1.0 - ce_weight) * kl + ce_weight * ce


def log_progress(name: str, step: int, settings: TrainSettings, loss: float, start: float) -> None:
    """Print one progress line."""
    elapsed = time.perf_counter() - start
    print(f"[{name}] step {step:5d}/{settings.steps} loss {loss:.4f} elapsed {elapsed:6.1f}s", flush=True)


def run_training(
    name: str,
    model: LlamaForCausalLM,
    stream: torch.Tensor,
    settings: TrainSettings,
    loss_of: Callable[[torch.Tensor], torch.Tensor],
) -> PhaseResult:
    """The loop both phases share: random windows, AdamW with warmup+cosine, clipped grads."""
    generator = torch.Generator().manual_seed(settings.seed)
    optimizer, scheduler = build_optimizer(model, settings)
    model.train()
    start = time.perf_counter()
    running = 0.0
    for step in range(settings.steps):
        loss = loss_of(sample_windows(stream, settings.batch_size, settings.seq_len, generator))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        running = loss.item() if step == 0 else 0.9 * running + 0.1 * loss.item()
        if (step + 1) % settings.log_every == 0 or step + 1 == settings.steps:
            log_progress(name, step + 1, settings, running, start)
    model.eval()
    seconds = time.perf_counter() - start
    return PhaseResult(settings.steps, seconds, running, settings.steps * settings.batch_size * settings.seq_len)


def train_target(model: LlamaForCausalLM, stream: torch.Tensor, settings: TrainSettings) -> PhaseResult:
    """Train the target with next-token cross-entropy on random windows."""

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        return next_token_loss(model(input_ids=batch[:, :-1]).logits, batch[:, 1:])

    return run_training("target", model, stream, settings, loss_of)


def train_draft(
    draft: LlamaForCausalLM,
    target: LlamaForCausalLM,
    stream: torch.Tensor,
    settings: TrainSettings,
    ce_weight: float,
) -> PhaseResult:
    """Distil the draft from the frozen target's logits on random windows."""
    target.eval()

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        inputs = batch[:, :-1]
        with torch.no_grad():
            target_logits = target(input_ids=inputs).logits
        return distillation_loss(draft(input_ids=inputs).logits, target_logits, batch[:, 1:], ce_weight)

    return run_training("draft", draft, stream, settings, loss_of)


# ----------------------------------------------------------------------- evaluation


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


def load_saved_model(model_dir: Path) -> LlamaForCausalLM:
    """Load a saved model back in float32 for evaluation."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model


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


# -------------------------------------------------------------------------- reports


@dataclass
class TrainingRecord:
    """Training-side numbers kept next to the report so ``--eval-only`` can re-render it."""

    command: str
    python: str
    torch: str
    train_files: int
    train_tokens: int
    tokenizer_seconds: float
    target: PhaseResult
    draft: PhaseResult
    total_seconds: float
    settings: dict[str, Any] = field(default_factory=dict)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write pretty JSON with a trailing newline."""
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")


def render_report(record: dict[str, Any], result: PairEval) -> str:
    """Markdown summary of the bundled pair."""
    t, d, acc = result.target, result.draft, result.acceptance
    tgt_train, dft_train = record["target"], record["draft"]
    rows = [
        ("Parameters", f"{t.params:,}", f"{d.params:,}"),
        ("Layers (hidden 256, 4 heads / 2 KV heads, FFN 688)", "4", "1"),
        ("model.safetensors (bf16)", f"{t.weights_mb:.2f} MB", f"{d.weights_mb:.2f} MB"),
        ("Directory incl. tokenizer", f"{t.dir_mb:.2f} MB", f"{d.dir_mb:.2f} MB"),
        ("Training steps (batch x 256 tokens)", f"{tgt_train['steps']}", f"{dft_train['steps']}"),
        ("Training tokens seen", f"{tgt_train['tokens_seen']:,}", f"{dft_train['tokens_seen']:,}"),
        ("Training time (2 CPU threads)", f"{tgt_train['seconds']:.0f} s", f"{dft_train['seconds']:.0f} s"),
        ("Held-out loss (nats/token)", f"{t.held_out_loss:.4f}", f"{d.held_out_loss:.4f}"),
        ("Held-out perplexity", f"{t.held_out_ppl:.2f}", f"{d.held_out_ppl:.2f}"),
    ]
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    return f"""# Tiny target + draft pair

Bundled Llama pair for tests and demos of speculative decoding, trained on CPU
from the Python {record['python']} standard library sources (no network).
`tiny-target/` and `tiny-draft/` share one byte-level BPE tokenizer (vocab 2048,
`<|endoftext|>` = id 0 is BOS/EOS/document separator). Weights are bfloat16 with
tied embeddings. Produced by `scripts/train_tiny_pair.py`.

| | tiny-target | tiny-draft |
|---|---|---|
{table}

- Total size of both directories: {result.total_mb:.2f} MB.
- Training corpus: {record['train_files']} files, {record['train_tokens']:,} tokens.
- Held-out set (~2 % of files by path hash): {result.held_out_files} files,
  {result.held_out_tokens:,} tokens; tokenizer roundtrip exact on
  {result.roundtrip_ok_files}/{result.held_out_files} of them.
- Tokenizer training {record['tokenizer_seconds']:.0f} s; whole run
  {record['total_seconds'] / 60:.1f} min. Times are wall clock with 2 CPU threads and
  vary with machine load; the step counts, not the clock, fix the result.
- The draft is distilled from the (bf16-rounded) target's logits:
  KL(target || draft) mixed with a little CE, starting from the target's embedding.

## Speculative decoding, greedy, k = {acc.k}

Measured on {acc.prompts} held-out prompts of {acc.prompt_tokens} tokens; the
target's greedy continuation of {acc.new_tokens} tokens is the reference, the draft
greedily proposes {acc.k} tokens per step; models loaded from these directories in
float32.

| Metric | Value |
|---|---|
| Per-token acceptance (accepted / proposed draft tokens) | {acc.acceptance:.3f} ({acc.accepted}/{acc.proposed}) |
| Mean accepted length (tokens per target step, incl. bonus) | {acc.mean_accepted_length:.2f} |
| SD steps for {acc.prompts} x {acc.new_tokens} tokens | {acc.sd_steps} |

## Reproduce

```
{record['command']}
```

Re-measure the saved pair: append `--eval-only`. Results are deterministic for a
given Python stdlib version and torch build (seeded, stop by step count);
torch {record['torch']} was used here.
"""


def write_reports(record: dict[str, Any], result: PairEval, report_path: Path) -> None:
    """Write TINY_PAIR.md and the machine-readable stats JSON next to it."""
    stats = {"training": record, "evaluation": asdict(result)}
    write_json(report_path.with_name("tiny_pair_stats.json"), stats)
    report_path.write_text(render_report(record, result))
    print(f"wrote {report_path}", flush=True)


def load_training_record(report_path: Path) -> dict[str, Any]:
    """Training numbers from a previous full run (for ``--eval-only``)."""
    stats_path = report_path.with_name("tiny_pair_stats.json")
    if not stats_path.exists():
        raise SystemExit(f"{stats_path} not found: run without --eval-only first")
    return json.loads(stats_path.read_text())["training"]


# ------------------------------------------------------------------------------ CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags; the defaults reproduce the bundled pair."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-dir", default=str(ASSETS_DIR / "tiny-target"))
    p.add_argument("--draft-dir", default=str(ASSETS_DIR / "tiny-draft"))
    p.add_argument("--report", default=str(ASSETS_DIR / "TINY_PAIR.md"))
    p.add_argument("--eval-only", action="store_true", help="only measure the saved models")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--held-out-fraction", type=float, default=0.02)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--target-steps", type=int, default=600, help="~8 min on 2 CPU cores")
    p.add_argument("--target-lr", type=float, default=2e-3)
    p.add_argument("--draft-steps", type=int, default=600, help="~5 min on 2 CPU cores")
    p.add_argument("--draft-lr", type=float, default=2e-3)
    p.add_argument("--draft-ce-weight", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--k", type=int, default=4, help="draft tokens proposed per SD step")
    p.add_argument("--eval-prompts", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=48)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--eval-batch-size", type=int, default=16)
    return p.parse_args(argv)


def phase_settings(args: argparse.Namespace, steps: int, lr: float, seed_offset: int) -> TrainSettings:
    """Settings of one training phase from the CLI flags."""
    return TrainSettings(
        steps=steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        peak_lr=lr,
        warmup_steps=min(args.warmup_steps, max(1, steps // 10)),
        min_lr_ratio=args.min_lr_ratio,
        weight_decay=args.weight_decay,
        log_every=args.log_every,
        seed=args.seed + seed_offset,
    )


def reproduce_command(argv: list[str] | None) -> str:
    """The command line of this run (repo-relative script path)."""
    flags = sys.argv[1:] if argv is None else argv
    flags = [f for f in flags if f != "--eval-only"]
    return shlex.join(["python", "scripts/train_tiny_pair.py", *flags])


def repo_relative(value: Any) -> Any:
    """Show paths inside the repository relative to its root (stable across checkouts)."""
    if isinstance(value, str) and Path(value).is_absolute() and Path(value).is_relative_to(REPO_ROOT):
        return Path(value).relative_to(REPO_ROOT).as_posix()
    return value


def train_pair(args: argparse.Namespace, corpus: Corpus, argv: list[str] | None) -> dict[str, Any]:
    """Train tokenizer, target and draft; save them; return the training record."""
    run_start = time.perf_counter()
    tok_start = time.perf_counter()
    tokenizer = train_bpe_tokenizer([f.text for f in corpus.train], VOCAB_SIZE)
    tokenizer_seconds = time.perf_counter() - tok_start
    stream = concatenate_with_eos(encode_documents(tokenizer, corpus.train))
    print(f"tokenizer: {tokenizer.get_vocab_size()} tokens in {tokenizer_seconds:.1f}s; "
          f"train stream {stream.numel():,} tokens", flush=True)

    torch.manual_seed(args.seed)
    target = LlamaForCausalLM(build_llama_config(num_layers=4))
    print(f"target: {count_parameters(target):,} params", flush=True)
    target_result = train_target(target, stream, phase_settings(args, args.target_steps, args.target_lr, 1))
    save_model(target, tokenizer, Path(args.target_dir))

    torch.manual_seed(args.seed + 2)
    draft = LlamaForCausalLM(build_llama_config(num_layers=1))
    init_draft_from_target(draft, target)
    print(f"draft: {count_parameters(draft):,} params", flush=True)
    draft_settings = phase_settings(args, args.draft_steps, args.draft_lr, 3)
    draft_result = train_draft(draft, target, stream, draft_settings, args.draft_ce_weight)
    save_model(draft, tokenizer, Path(args.draft_dir))

    record = TrainingRecord(
        command=reproduce_command(argv),
        python=platform.python_version(),
        torch=torch.__version__,
        train_files=len(corpus.train),
        train_tokens=stream.numel(),
        tokenizer_seconds=tokenizer_seconds,
        target=target_result,
        draft=draft_result,
        total_seconds=time.perf_counter() - run_start,
        settings={k: repo_relative(v) for k, v in vars(args).items() if k != "eval_only"},
    )
    return asdict(record)


def main(argv: list[str] | None = None) -> None:
    """Train (unless ``--eval-only``), then evaluate and write the report."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    corpus = load_corpus(args.held_out_fraction)
    report_path = Path(args.report)
    record = load_training_record(report_path) if args.eval_only else train_pair(args, corpus, argv)
    result = evaluate_pair(args, corpus)
    write_reports(record, result, report_path)


if __name__ == "__main__":
    main()
