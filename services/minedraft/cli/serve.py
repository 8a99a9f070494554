"""`minedraft serve`: the whole stack on one machine.

A child that dies is reaped and restarted with backoff (the batch manager reconnects to a
restarted verifier and brings a restarted draft service back into the loop). Ctrl-C or SIGTERM
is forwarded to every child; the launcher waits for their drain (requests in flight finish)
and exits 0 when every child did.
"""

from __future__ import annotations

import argparse
import signal
import threading

from minedraft.batch_manager.policy import MODES
from minedraft.batch_manager.server_flags import DEFAULT_ADMIN_PORT, DEFAULT_DRAIN_GRACE_S, add_prompt_flags
from minedraft.bundled import TINY_DRAFT, TINY_EAGLE, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig
from minedraft.worker.settings import DRAFT_KINDS, env

SUPERVISE_EVERY_S = 0.5


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="start verifier, draft service and batch manager locally")
    p.add_argument("--target", default=str(TINY_TARGET), help="target model folder (default: bundled tiny)")
    p.add_argument("--draft", default="", help="draft model folder, or with --draft-kind eagle the EAGLE head's "
                                               "(default: the bundled tiny draft model or head)")
    p.add_argument("--draft-kind", choices=DRAFT_KINDS, default="model",
                   help="what drafts: a draft model, or an EAGLE head that reads the target's hidden states")
    p.add_argument("--host", default="127.0.0.1", help="where the public APIs listen")
    p.add_argument("--grpc-port", type=int, default=50051)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--admin-port", type=int, default=DEFAULT_ADMIN_PORT,
                   help="the admin API (/admin/policy), on 127.0.0.1 only")
    p.add_argument("--target-device", default="cpu")
    p.add_argument("--draft-device", default="cpu")
    p.add_argument("--mode", choices=MODES, default="psd")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker process")
    p.add_argument("--tp-size", type=int, default=1,
                   help="tensor-parallel ranks for the target; --target-device may list one device per rank")
    p.add_argument("--api-key", default=env("API_KEY", ""),
                   help="API keys the public APIs accept, comma-separated (Authorization: Bearer <key>); none = no "
                        "check [MINEDRAFT_API_KEY]")
    p.add_argument("--api-key-file", default=env("API_KEY_FILE", ""),
                   help="file with one accepted API key per line [MINEDRAFT_API_KEY_FILE]")
    p.add_argument("--drain-grace-s", type=float, default=float(env("DRAIN_GRACE_S", str(DEFAULT_DRAIN_GRACE_S))),
                   help="on Ctrl-C / SIGTERM, seconds requests in flight may take to finish [MINEDRAFT_DRAIN_GRACE_S]")
    add_prompt_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    stack = LocalStack(StackConfig(
        target=args.target, draft=args.draft or str(TINY_EAGLE if args.draft_kind == "eagle" else TINY_DRAFT),
        draft_kind=args.draft_kind, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
        admin_port=args.admin_port, target_device=args.target_device, draft_device=args.draft_device,
        mode=args.mode, k=args.k, threads=args.threads, tp_size=args.tp_size, drain_grace_s=args.drain_grace_s,
        api_key=args.api_key, api_key_file=args.api_key_file, enable_prefix_caching=args.enable_prefix_caching,
        max_num_batched_tokens=args.max_num_batched_tokens,
    ))
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():  # a second Ctrl-C: the services cut their drain short
            stack.signal_all(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    codes: dict[str, int] = {}
    try:
        stack.start()
        print(f"minedraft is serving (mode {args.mode}, k={args.k}, draft {args.draft_kind}):")
        print(f"  gRPC  {args.host}:{args.grpc_port}   (minedraft.v1.Generation, health, reflection)")
        print(f"  HTTP  http://{args.host}:{args.http_port}/v1   (OpenAI-compatible; /health, /v1/models)")
        print(f"  admin http://127.0.0.1:{stack.admin_port}/admin/policy   (live policy)")
        print("Press Ctrl-C to stop.", flush=True)
        while not stop.wait(SUPERVISE_EVERY_S):
            for event in stack.supervise():
                print(f"minedraft: {event}", flush=True)
        print("minedraft: stopping: the services finish the requests in flight first", flush=True)
    finally:
        codes = stack.stop()
        print("minedraft: stopped (" + ", ".join(f"{name} exited {code}" for name, code in codes.items()) + ")",
              flush=True)
    return 0 if codes and all(code == 0 for code in codes.values()) else 1
