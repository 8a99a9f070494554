"""`minedraft serve`: the whole stack on one machine, stopped cleanly by Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading

from minedraft.batch_manager.policy import MODES
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="start verifier, draft service and batch manager locally")
    p.add_argument("--target", default=str(TINY_TARGET), help="target model folder (default: bundled tiny)")
    p.add_argument("--draft", default=str(TINY_DRAFT), help="draft model folder (default: bundled tiny)")
    p.add_argument("--host", default="127.0.0.1", help="where the public APIs listen")
    p.add_argument("--grpc-port", type=int, default=50051)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--target-device", default="cpu")
    p.add_argument("--draft-device", default="cpu")
    p.add_argument("--mode", choices=MODES, default="psd")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker process")
    p.add_argument("--tp-size", type=int, default=1,
                   help="tensor-parallel ranks for the target; --target-device may list one device per rank")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    stack = LocalStack(StackConfig(
        target=args.target, draft=args.draft, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
        target_device=args.target_device, draft_device=args.draft_device, mode=args.mode, k=args.k,
        threads=args.threads, tp_size=args.tp_size,
    ))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stack.start()
        print(f"minedraft is serving (mode {args.mode}, k={args.k}):")
        print(f"  gRPC  {args.host}:{args.grpc_port}   (minedraft.v1.Generation, health, reflection)")
        print(f"  HTTP  http://{args.host}:{args.http_port}/v1   (OpenAI-compatible; /health, /v1/models)")
        print("Press Ctrl-C to stop.", flush=True)
        while not stop.wait(0.5):
            died = stack.first_exit()
            if died is not None:
                print(f"minedraft: {died[0]} exited with code {died[1]}; stopping")
                return 1
        return 0
    finally:
        stack.stop()
        print("minedraft: stopped")
