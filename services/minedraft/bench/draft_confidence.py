"""How sure the synthetic draft is, token by token: `:calib=C` and `:miscal=M` on a peaked pair.

The peaked draft (peaked_head.py) is about 100% sure of every choice, right or wrong, so a policy that
reads its confidence (TETRIS) learns nothing from it. Real drafts are partly calibrated: where they
disagree with the target they tend to be less sure. Two knobs, each a seeded share of tokens x:

- `calib`: of the tokens where the draft's successor differs from the target's, the share where the
  draft is unsure (its largest probability about 0.3); the rest of them it still gets wrong with full
  confidence. 0 (the default) leaves the draft as it was; 1 makes low confidence a perfect alarm.
- `miscal`: of the tokens where the two agree, the share where the draft is unsure anyway (false alarms).

Damping changes the draft's confidence after x, never its choice: its logits there are all divided by
about the same factor, a temperature per input token. The draft's embedding row of x gets a large value
on one hidden channel (SINK_CHANNEL) whose gain in every RMSNorm is 0: a norm divides the whole state by
its RMS, which that value dominates, so every other channel shrinks alike and nothing reads the sink
itself. The final norm so scales every logit down; the layers' norms hand the layers a small input, so
they add little drift and the state stays along e_x (sinking only the final norm left the damped choice
within 0.03 of the next logit on some tokens at the tiny shape). The value puts the chosen logit near
log V - DAMPED_GAP, over a rest scaled nearly flat, so the largest probability is about
1 / (1 + e^DAMPED_GAP). Measured in bf16 after damped tokens (max q mean, range; the choice's lead):
Llama-3-8B shape, 4-layer draft: 0.32, 0.17-0.46, >= 9 units; `small`: 0.32, 0.11-0.69, >= 3.6; `tiny`:
0.35, 0.07-0.82, >= 2. Undamped tokens keep their full peak (max q 1.000 at 8B and `small`; the sink
channel's zero gain moves their logits by a fraction of a unit against leads of tens).
"""

from __future__ import annotations

import math

import torch

from minedraft.bench.peaked_head import PEAK_SCALE, successors

SINK_CHANNEL = 0
DAMPED_GAP = 0.8  # the damped chosen logit sits this far below log V: max q ~ 0.3 over a flat rest
DRIFT_RMS = 1.5  # a bound on the damped token's residual stream RMS without the sink (e_x alone: 1)


def damped_tokens(vocab: int, agree: float, calib: float, miscal: float, seed: int) -> torch.Tensor:
    """[vocab] bool: the input tokens after which the draft is unsure, a seeded share `calib` of those where
    the draft's successor differs from the target's and a share `miscal` of those where they agree."""
    cpu = torch.device("cpu")
    same = successors(vocab, True, agree, seed, cpu) == successors(vocab, False, agree, seed, cpu)
    draw = torch.rand(vocab, generator=torch.Generator(device="cpu").manual_seed(seed * 104729 + 29))
    return torch.where(same, draw < miscal, draw < calib)


def sink_value(hidden: int, vocab: int) -> float:
    """The sink channel's value for a damped token: the chosen logit is PEAK_SCALE * e_x . h, where the final
    norm scales the state to RMS 1, so with the sink's value B the logit is about
    PEAK_SCALE * hidden^1.5 / sqrt(B^2 + DRIFT_RMS^2 hidden); solved for a logit of log V - DAMPED_GAP."""
    goal = math.log(vocab) - DAMPED_GAP
    return math.sqrt(max((PEAK_SCALE * hidden**1.5 / goal) ** 2 - DRIFT_RMS**2 * hidden, hidden))


def sink_embedding(embedding: torch.Tensor, damped: torch.Tensor) -> torch.Tensor:
    """The draft's embedding [V, H] with the sink value on SINK_CHANNEL of every damped row, in its dtype."""
    out = embedding.clone()
    value = sink_value(embedding.shape[1], embedding.shape[0])
    out[damped.to(embedding.device), SINK_CHANNEL] = value
    return out


def sink_norm_gain(weight: torch.Tensor) -> torch.Tensor:
    """A norm's gain [H] with SINK_CHANNEL silenced, so no layer and not the head reads the sink."""
    out = weight.clone()
    out[SINK_CHANNEL] = 0.0
    return out
