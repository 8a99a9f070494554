"""Log-probabilities of emitted (or prompt) tokens from the target's distribution at their positions.

Everything a position reports (the token's value, its rank, the top alternatives) is read from one float32
log-softmax tensor, so a greedy token's value equals the first alternative's bit for bit (evaluation
harnesses check `is_greedy` by equality). Values are floored at -9999 (vLLM's floor), since a masked
token's -inf has no JSON form. The results are packed into one float32 tensor per step for a single
readback: [value, rank, top_n values, top_n ids] per position (ids and ranks are exact in float32 below
2**24, far above any vocabulary).
"""

from __future__ import annotations

import torch

from minedraft.core.logprobs import TokenLogprob

LOGPROB_FLOOR = -9999.0


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def pack(logprobs: torch.Tensor, tokens: torch.Tensor, top_n: int) -> torch.Tensor:
    """logprobs [R, T, V], tokens [R, T] (-1 padding allowed) -> [R, T, 2 + 2 top_n] float32."""
    logprobs = logprobs.clamp(min=LOGPROB_FLOOR)
    chosen = logprobs.gather(-1, tokens.clamp(min=0).long().unsqueeze(-1))  # [R, T, 1]
    rank = (logprobs >= chosen).sum(dim=-1, keepdim=True).float()  # ties count against the token, as vLLM
    parts = [chosen, rank]
    if top_n > 0:
        values, ids = logprobs.topk(top_n, dim=-1)
        parts += [values, ids.float()]
    return torch.cat(parts, dim=-1)


def unpack(row: list[list[float]], count: int, top_n: int, width: int, tokens: list[int]) -> list[TokenLogprob]:
    """The first `count` positions of one packed row (`width`: the top_n it was packed with), each keeping
    `top_n` alternatives."""
    out = []
    for slot in range(count):
        cells = row[slot]
        values, ids = cells[2:2 + width], cells[2 + width:2 + 2 * width]
        top = [(int(ids[j]), values[j]) for j in range(top_n)]
        out.append(TokenLogprob(tokens[slot], cells[0], int(cells[1]), top))
    return out
