"""`minedraft batch-manager`: public gRPC + HTTP APIs over the two workers."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

import uvicorn

from minedraft.batch_manager.admin_api import install_admin_routes
from minedraft.batch_manager.config import MODES, ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.batch_manager.grpc_api import build_grpc_server
from minedraft.batch_manager.http_api import build_http_app
from minedraft.bundled import TINY_TARGET
from minedraft.core.tokenizer import Tokenizer
from minedraft.worker.settings import env


def add_manager_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=env("HOST", "127.0.0.1"), help="bind address [MINEDRAFT_HOST]")
    p.add_argument("--grpc-port", type=int, default=int(env("GRPC_PORT", "50051")), help="[MINEDRAFT_GRPC_PORT]")
    p.add_argument("--http-port", type=int, default=int(env("HTTP_PORT", "8000")), help="[MINEDRAFT_HTTP_PORT]")
    p.add_argument("--mode", choices=MODES, default=env("MODE", "psd"), help="[MINEDRAFT_MODE]")
    p.add_argument("--k", type=int, default=int(env("K", "4")), help="draft tokens per step [MINEDRAFT_K]")
    p.add_argument("--max-num-seqs", type=int, default=int(env("MAX_NUM_SEQS", "64")),
                   help="running requests, both batches together [MINEDRAFT_MAX_NUM_SEQS]")
    p.add_argument("--max-queue", type=int, default=int(env("MAX_QUEUE", "1024")),
                   help="waiting requests before 429 [MINEDRAFT_MAX_QUEUE]")
    p.add_argument("--data-plane-backend", default=env("DATA_PLANE_BACKEND", "gloo"),
                   help="gloo (CPU) or nccl (GPU) [MINEDRAFT_DATA_PLANE_BACKEND]")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batch-manager", help="run the batch manager (public APIs, step driver)")
    add_manager_flags(p)
    p.add_argument("--tokenizer", default=env("TOKENIZER", str(TINY_TARGET)),
                   help="folder with tokenizer.json (usually the target's) [MINEDRAFT_TOKENIZER]")
    p.add_argument("--served-model-name", default=env("SERVED_MODEL_NAME", ""),
                   help="model name in the APIs (default: the tokenizer folder's name)")
    p.add_argument("--target-address", default=env("TARGET_ADDRESS", "127.0.0.1:50061"),
                   help="verifier control address [MINEDRAFT_TARGET_ADDRESS]")
    p.add_argument("--draft-address", default=env("DRAFT_ADDRESS", "127.0.0.1:50062"),
                   help="draft service control address; empty for none [MINEDRAFT_DRAFT_ADDRESS]")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s batch-manager %(levelname)s %(message)s")
    return asyncio.run(serve(args))


async def serve(args: argparse.Namespace) -> int:
    config = ManagerConfig(mode=args.mode, k=args.k, max_num_seqs=args.max_num_seqs, max_queue=args.max_queue,
                           data_plane_backend=args.data_plane_backend)
    tokenizer = Tokenizer(args.tokenizer)
    name = args.served_model_name or Path(args.tokenizer).name
    coordinator = Coordinator(tokenizer, name, args.target_address, args.draft_address or None, config)
    await coordinator.start()
    grpc_server = build_grpc_server(coordinator, args.host, args.grpc_port)
    await grpc_server.start()
    app = build_http_app(coordinator)
    install_admin_routes(app, coordinator)
    http = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.http_port, log_level="warning"))
    http.install_signal_handlers = lambda: None  # signals are handled below, for all three parts
    http_task = asyncio.create_task(http.serve())
    logging.info("batch manager ready: gRPC %s:%d, HTTP http://%s:%d (mode %s)", args.host, grpc_server.port,
                 args.host, args.http_port, args.mode)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.info("draining: refusing new requests")
    http.should_exit = True
    await grpc_server.stop(grace=5)
    await http_task
    await coordinator.stop()
    return 0
