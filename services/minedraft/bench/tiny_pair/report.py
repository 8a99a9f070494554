"""TINY_PAIR.md and tiny_pair_stats.json: what was trained and what the evaluation measured."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from minedraft.bench.tiny_pair.bpe_tokenizer import write_json
from minedraft.bench.tiny_pair.evaluation import PairEval
from minedraft.bench.tiny_pair.training import PhaseResult

COMMAND = "python -m minedraft.bench.tiny_pair"


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
tied embeddings. Produced by `{COMMAND}`.

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
