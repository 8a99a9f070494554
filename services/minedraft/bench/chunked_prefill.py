"""`minedraft bench chunked-prefill`: what a long prompt arriving does to the streams already decoding, with
chunked prefill (the verifier device's default token budget per step) against unchunked (a budget no prompt
reaches), through the services and their OpenAI HTTP API, timed at the client.

M streams decode long greedy outputs (ignore_eos). Once every one of them has streamed for a while, long
prompts arrive one at a time, each after the previous one's first token and a pause. A long prompt's window
runs from its sending to its first token; every gap between two chunks of a running stream that overlaps a
window is a gap the prefill may have stretched. The table gives those gaps' p50 / p99 / max beside the
median gap of the whole run (steady decoding), the long prompts' TTFT, and whether each long prompt's first
token came while every stream still ran. One fresh stack per arm (arm_stacks.py), arms alternating over
rounds on fresh prompts; greedy outputs must be the same in both arms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from minedraft.bench import flags
from minedraft.bench.arm_stacks import Arm, compare, flags_of, placed
from minedraft.bench.latency import ms, overlapping, percentile, seconds
from minedraft.bench.prompt_corpus import Corpus
from minedraft.bench.sse_client import StreamRecord, completion_body, http_client, model_name, stream
from minedraft.bundled import TINY_TARGET
from minedraft.cli.local_stack import LocalStack
from minedraft.core.tokenizer import Tokenizer

DEFAULTS = {  # what a 0 flag means, by device (the tiny pair's context is 1024 tokens, the 8B shape's 8192)
    "cpu": {"stream_tokens": 600, "long_tokens": 900, "settle_ms": 300, "num_blocks": 4096},
    "cuda": {"stream_tokens": 1500, "long_tokens": 6000, "settle_ms": 300, "num_blocks": 4096},
}
STREAM_PROMPT = 32


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    for key, value in DEFAULTS[args.device].items():
        if not getattr(args, key):
            setattr(args, key, value)
    return args


def arms(args: argparse.Namespace) -> list[Arm]:
    chunked = f"chunked ({args.budget or 'default'} tokens/step)"
    return [Arm(chunked, max_num_batched_tokens=args.budget),
            Arm(f"unchunked ({args.unchunked_budget})", max_num_batched_tokens=args.unchunked_budget)]


async def run_round(port: int, streams: list[list[int]], longs: list[list[int]], args: argparse.Namespace
                    ) -> dict:
    """The streams, then each long prompt in turn while they run; returns every record."""
    async with http_client(port) as client:
        model = await model_name(client)
        tasks = [asyncio.ensure_future(stream(client, "/v1/completions",
                                              completion_body(model, p, args.stream_tokens)))
                 for p in streams]
        await asyncio.sleep(args.settle_ms / 1000)
        long_records: list[StreamRecord] = []
        for prompt in longs:
            long_records.append(await stream(client, "/v1/completions",
                                             completion_body(model, prompt, args.long_max_tokens)))
            await asyncio.sleep(args.pause_ms / 1000)
        return {"streams": list(await asyncio.gather(*tasks)), "longs": long_records}


def window_gaps(streams: list[StreamRecord], longs: list[StreamRecord]) -> list[float]:
    """Gaps of the running streams that overlap some long prompt's prefill (its sending to its first token)."""
    out = []
    for s in streams:
        hit = {iv for long in longs for iv in overlapping(s.intervals(), long.sent, long.first)}
        out.extend(b - a for a, b in sorted(hit))
    return out


def summarize(name: str, runs: list[dict]) -> dict:
    streams = [s for run in runs for s in run["streams"]]
    longs = [x for run in runs for x in run["longs"]]
    every = [g for s in streams for g in s.gaps()]
    inside = [g for run in runs for g in window_gaps(run["streams"], run["longs"])]
    steady = percentile(every, 50)
    during = [all(x.first < s.end for s in run["streams"]) for run in runs for x in run["longs"]]
    top = max(inside, default=0.0)
    return {"arm": name, "streams": len(streams), "long_prompts": len(longs), "gap_p50_all_ms": ms(steady),
            "gap_p50_ms": ms(percentile(inside, 50)), "gap_p99_ms": ms(percentile(inside, 99)), "gap_max_ms": ms(top),
            "max_over_median": round(top / steady, 2) if steady else 0.0, "window_gaps": len(inside),
            "long_ttft_p50_ms": ms(percentile([x.ttft for x in longs], 50)),
            "long_ttft_max_ms": ms(max(x.ttft for x in longs)), "first_token_while_streams_ran": sum(during)}


def same_outputs(a: list[dict], b: list[dict]) -> tuple[int, int]:
    """(requests whose greedy token ids match in both arms, requests compared) over every round."""
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for key in ("streams", "longs")
             for x, y in zip(ra[key], rb[key], strict=True)]
    return sum(x.token_ids == y.token_ids for x, y in pairs), len(pairs)


def warm_up(stack: LocalStack, corpus: Corpus, args: argparse.Namespace) -> None:
    """A short untimed round on prompts of its own: first-use costs stay out of the timed rounds."""
    quick = argparse.Namespace(**{**vars(args), "stream_tokens": 16, "settle_ms": 0, "pause_ms": 0,
                                  "long_max_tokens": 2})
    asyncio.run(run_round(stack.cfg.http_port, [corpus.take(STREAM_PROMPT) for _ in range(args.streams)],
                          [corpus.take(args.long_tokens)], quick))


def relative(result: dict) -> dict[str, list[list[float]]]:
    """One round's clock for a results file, from the streams' sending: each stream's chunk arrivals, and each
    long prompt's sending and first token."""
    t0 = min(s.sent for s in result["streams"])
    return {"streams": [seconds([t - t0 for t in s.times]) for s in result["streams"]],
            "longs": [seconds([x.sent - t0, x.first - t0]) for x in result["longs"]]}


def print_table(rows: list[dict]) -> None:
    print("| arm | stream gap p50 ms (whole run) | gap p50 ms (during prefill) | gap p99 ms | gap max ms | "
          "max / median | long prompt TTFT p50 ms | TTFT max ms | first token while streams ran |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['gap_p50_all_ms']} | {r['gap_p50_ms']} | {r['gap_p99_ms']} | {r['gap_max_ms']} | "
              f"{r['max_over_median']}x | {r['long_ttft_p50_ms']} | {r['long_ttft_max_ms']} | "
              f"{r['first_token_while_streams_ran']} of {r['long_prompts']} |")


def run(args: argparse.Namespace) -> int:
    args = resolve(args)
    corpus = Corpus(Tokenizer(str(TINY_TARGET)))
    sides = arms(args)

    def workload() -> tuple[list[list[int]], list[list[int]]]:
        return ([corpus.take(STREAM_PROMPT) for _ in range(args.streams)],
                [corpus.take(args.long_tokens) for _ in range(args.long_prompts)])

    raw = compare(args, sides, args.streams + args.long_prompts, lambda s: warm_up(s, corpus, args), workload,
                  lambda stack, work: asyncio.run(run_round(stack.cfg.http_port, *work, args)))
    matched, compared = same_outputs(raw[sides[0].name], raw[sides[1].name])
    rows = [summarize(arm.name, raw[arm.name]) for arm in sides]
    print(f"{placed(args)}; {args.rounds} round(s), arms alternating; {args.streams} streams of "
          f"{STREAM_PROMPT}-token prompts decoding {args.stream_tokens} tokens; {args.long_prompts} long prompts of "
          f"{args.long_tokens} tokens ({args.long_max_tokens} tokens out) one at a time, the first "
          f"{args.settle_ms} ms after the streams, each next {args.pause_ms} ms after the previous one's first token")
    print_table(rows)
    print(f"greedy outputs identical chunked and unchunked: {'yes' if matched == compared else 'NO'} "
          f"({matched} of {compared} requests)")
    if args.json_out:
        timeline = {name: [relative(run) for run in runs] for name, runs in raw.items()}
        out = {"args": flags_of(args, flags.add_chunked_prefill_flags), "rows": rows, "timeline_s": timeline,
               "identical": [matched, compared]}
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    return 0 if matched == compared else 1
