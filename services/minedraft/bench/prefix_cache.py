"""`minedraft bench prefix-cache`: automatic prefix caching on vs off, through the services and their OpenAI
HTTP API, streamed, timed at the client.

Two workloads, each on one fresh stack per arm (arm_stacks.py; the batch manager's --enable-prefix-caching
or --no-enable-prefix-caching):
- shared prefix: N requests of one long common prefix and a short suffix of their own. The first goes
  alone, as the first user of a system prompt does, and fills the cache; the other N - 1 arrive together
  once it has answered. Their time to first token (TTFT) and throughput are the comparison; the first
  request's TTFT is shown apart (it is cold in both arms).
- multi-turn chat: C conversations at once through /v1/chat/completions, one shared system message, each
  turn's messages the previous turn's plus its answer and a new user message.
Rounds use fresh prompts (prompt_corpus.py), so a later round meets a cold cache too, and alternate the arms'
order. Greedy outputs must be the same token ids in both arms; the command says whether they were.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from minedraft.bench import flags
from minedraft.bench.arm_stacks import Arm, compare, flags_of, placed, prefix_stats, stats_delta
from minedraft.bench.client import fetch_status
from minedraft.bench.latency import ms, percentile, seconds
from minedraft.bench.prompt_corpus import Corpus
from minedraft.bench.sse_client import StreamRecord, chat_body, completion_body, http_client, model_name, stream
from minedraft.bundled import TINY_TARGET
from minedraft.cli.local_stack import LocalStack
from minedraft.core.tokenizer import Tokenizer

DEFAULTS = {  # what a 0 flag means, by device: the tiny pair's context is 1024 tokens, the 8B shape's 8192
    "cpu": {"requests": 24, "prefix_tokens": 700, "conversations": 4, "system_tokens": 64, "user_tokens": 96,
            "answer_tokens": 32, "num_blocks": 4096},
    "cuda": {"requests": 64, "prefix_tokens": 2048, "conversations": 16, "system_tokens": 256, "user_tokens": 256,
             "answer_tokens": 64, "num_blocks": 10000},
}
ARMS = (Arm("caching on", enable_prefix_caching=True), Arm("caching off", enable_prefix_caching=False))


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill every 0 flag with the device's default."""
    for key, value in DEFAULTS[args.device].items():
        if not getattr(args, key):
            setattr(args, key, value)
    return args


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    prefix: list[int]
    suffixes: list[list[int]]

    def prompts(self) -> list[list[int]]:
        return [self.prefix + s for s in self.suffixes]


def shared_prefix(corpus: Corpus, requests: int, prefix_tokens: int, suffix_tokens: int) -> SharedPrefix:
    return SharedPrefix(corpus.take(prefix_tokens), [corpus.take(suffix_tokens) for _ in range(requests)])


@dataclass(frozen=True, slots=True)
class ChatScript:
    system: str
    users: list[list[str]]  # [conversation][turn]


def chat_script(corpus: Corpus, conversations: int, turns: int, system_tokens: int, user_tokens: int) -> ChatScript:
    system = corpus.text(system_tokens)
    return ChatScript(system, [[corpus.text(user_tokens) for _ in range(turns)] for _ in range(conversations)])


def next_turn(messages: list[dict[str, str]], answer: str | None, user: str) -> list[dict[str, str]]:
    """The next request's messages: everything said so far, the last answer, the new question."""
    said = [*messages, {"role": "assistant", "content": answer}] if answer is not None else list(messages)
    return [*said, {"role": "user", "content": user}]


async def run_shared(client: httpx.AsyncClient, model: str, work: SharedPrefix, max_tokens: int
                     ) -> tuple[StreamRecord, list[StreamRecord], float]:
    """The lead request alone, then the rest at once; returns (lead, rest, wall seconds of the rest)."""
    prompts = work.prompts()
    lead = await stream(client, "/v1/completions", completion_body(model, prompts[0], max_tokens))
    start = time.perf_counter()
    rest = await asyncio.gather(*(stream(client, "/v1/completions", completion_body(model, p, max_tokens))
                                  for p in prompts[1:]))
    return lead, list(rest), time.perf_counter() - start


async def run_chat(client: httpx.AsyncClient, model: str, script: ChatScript, answer_tokens: int
                   ) -> tuple[list[list[StreamRecord]], float]:
    """Every conversation at once, its turns one after another; returns each conversation's turns and the wall."""

    async def conversation(users: list[str]) -> list[StreamRecord]:
        messages: list[dict[str, str]] = [{"role": "system", "content": script.system}]
        answer: str | None = None
        turns = []
        for user in users:
            messages = next_turn(messages, answer, user)
            record = await stream(client, "/v1/chat/completions", chat_body(model, messages, answer_tokens))
            answer = record.text
            turns.append(record)
        return turns

    start = time.perf_counter()
    out = await asyncio.gather(*(conversation(users) for users in script.users))
    return list(out), time.perf_counter() - start


def measure(stack: LocalStack, work: SharedPrefix, script: ChatScript, args: argparse.Namespace) -> dict:
    """Both workloads on one arm's stack, with /health's cache counts around each."""
    port = stack.cfg.http_port

    async def go() -> dict:
        async with http_client(port) as client:
            model = await model_name(client)
            before = prefix_stats(fetch_status(port))
            lead, rest, wall = await run_shared(client, model, work, args.max_tokens)
            middle = prefix_stats(fetch_status(port))
            turns, chat_wall = await run_chat(client, model, script, args.answer_tokens)
            after = prefix_stats(fetch_status(port))
        return {"shared": {"lead": lead, "records": rest, "wall": wall, "cache": stats_delta(middle, before)},
                "chat": {"turns": turns, "records": [r for c in turns for r in c], "wall": chat_wall,
                         "cache": stats_delta(after, middle)}}

    return asyncio.run(go())


def warm_up(stack: LocalStack, corpus: Corpus, args: argparse.Namespace) -> None:
    """One untimed shared-prefix run on prompts of its own: first-use costs stay out of the timed rounds."""
    work = shared_prefix(corpus, min(args.requests, 8), args.prefix_tokens, args.suffix_tokens)

    async def go() -> None:
        async with http_client(stack.cfg.http_port) as client:
            await run_shared(client, await model_name(client), work, 4)

    asyncio.run(go())


def summarize(workload: str, arm: str, runs: list[dict]) -> dict:
    """Pooled over rounds: TTFT percentiles of every request, throughput over the summed wall time."""
    records = [r for run in runs for r in run["records"]]
    wall = sum(run["wall"] for run in runs)
    ttfts = [r.ttft for r in records]
    cache = {m: {k: sum(run["cache"][m][k] for run in runs) for k in ("hits", "queries")} for m in ("target", "draft")}
    row = {"workload": workload, "arm": arm, "requests": len(records), "ttft_p50_ms": ms(percentile(ttfts, 50)),
           "ttft_p99_ms": ms(percentile(ttfts, 99)),
           "output_tok_s": round(sum(len(r.token_ids) for r in records) / wall, 1),
           "prompt_tok_s": round(sum(r.prompt_tokens for r in records) / wall, 1), "cache": cache}
    if workload == "shared prefix":
        row["lead_ttft_ms"] = ms(percentile([run["lead"].ttft for run in runs], 50))
    else:
        turns = len(runs[0]["turns"][0])
        row["ttft_p50_by_turn_ms"] = [ms(percentile([c[t].ttft for run in runs for c in run["turns"]], 50))
                                      for t in range(turns)]
    return row


def same_outputs(on_runs: list[dict], off_runs: list[dict]) -> tuple[int, int]:
    """(requests whose greedy token ids match in both arms, requests compared) over every round and workload."""
    pairs = []
    for on, off in zip(on_runs, off_runs, strict=True):
        pairs.append((on["shared"]["lead"], off["shared"]["lead"]))
        pairs += list(zip(on["shared"]["records"], off["shared"]["records"], strict=True))
        pairs += list(zip(on["chat"]["records"], off["chat"]["records"], strict=True))
    return sum(a.token_ids == b.token_ids for a, b in pairs), len(pairs)


def print_table(rows: list[dict]) -> None:
    print("| workload | arm | requests | TTFT p50 ms | TTFT p99 ms | output tok/s | prompt tok/s | "
          "target hits / queries | draft hits / queries |")
    print("|---|---|---|---|---|---|---|---|---|")
    for on, off in zip(rows[::2], rows[1::2], strict=True):
        for r in (on, off):
            c = r["cache"]
            print(f"| {r['workload']} | {r['arm']} | {r['requests']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} | "
                  f"{r['output_tok_s']} | {r['prompt_tok_s']} | {c['target']['hits']} / {c['target']['queries']} | "
                  f"{c['draft']['hits']} / {c['draft']['queries']} |")
        ratio = [f"{on[k] / off[k]:.2f}x" if off[k] else "-" for k in ("ttft_p50_ms", "ttft_p99_ms", "output_tok_s",
                                                                         "prompt_tok_s")]
        print(f"| {on['workload']} | on / off | | {' | '.join(ratio)} | | |")


def run(args: argparse.Namespace) -> int:
    args = resolve(args)
    corpus = Corpus(Tokenizer(str(TINY_TARGET)))

    def workload() -> tuple[SharedPrefix, ChatScript]:
        return (shared_prefix(corpus, args.requests, args.prefix_tokens, args.suffix_tokens),
                chat_script(corpus, args.conversations, args.turns, args.system_tokens, args.user_tokens))

    raw = compare(args, list(ARMS), max(args.requests, args.conversations), lambda s: warm_up(s, corpus, args),
                  workload, lambda stack, work: measure(stack, *work, args))
    matched, compared = same_outputs(raw[ARMS[0].name], raw[ARMS[1].name])
    rows = [summarize(w, arm.name, [run[key] for run in raw[arm.name]])
            for w, key in (("shared prefix", "shared"), ("multi-turn chat", "chat")) for arm in ARMS]
    print(f"{placed(args)}; {args.rounds} round(s), arms alternating; shared prefix: {args.requests} requests "
          f"(1 alone, then {args.requests - 1} at once), {args.prefix_tokens}-token common prefix + "
          f"{args.suffix_tokens}-token suffixes, {args.max_tokens} tokens out; chat: {args.conversations} "
          f"conversations x {args.turns} turns, {args.system_tokens}-token system message, ~{args.user_tokens}-token "
          f"user messages, {args.answer_tokens}-token answers")
    print_table(rows)
    for r in rows:
        extra = (f"first request alone: TTFT {r['lead_ttft_ms']} ms" if "lead_ttft_ms" in r
                 else f"TTFT p50 by turn (ms): {r['ttft_p50_by_turn_ms']}")
        print(f"{r['workload']}, {r['arm']}: {extra}")
    print(f"greedy outputs identical with caching on and off: {'yes' if matched == compared else 'NO'} "
          f"({matched} of {compared} requests)")
    if args.json_out:
        ttfts = {name: {key: seconds([r.ttft for run in runs for r in run[key]["records"]])
                        for key in ("shared", "chat")} for name, runs in raw.items()}
        out = {"args": flags_of(args, flags.add_prefix_cache_flags), "rows": rows, "ttft_s": ttfts,
               "identical": [matched, compared]}
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    return 0 if matched == compared else 1
