"""`minedraft batch-manager`: public gRPC + HTTP APIs over the two workers."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from dataclasses import fields
from pathlib import Path

import uvicorn

from minedraft.batch_manager.admin_api import build_admin_app, install_admin_routes
from minedraft.batch_manager.config import DATA_PLANE_BACKENDS, ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.batch_manager.grpc_api import build_grpc_server
from minedraft.batch_manager.http_api import build_http_app
from minedraft.batch_manager.policy import POLICY_FIELDS
from minedraft.batch_manager.step_observer import MetricsObserver
from minedraft.bundled import TINY_TARGET
from minedraft.core.errors import InvalidRequestError
from minedraft.core.tokenizer import Tokenizer
from minedraft.observability.logs import configure_logging
from minedraft.observability.metrics import ServingMetrics
from minedraft.observability.tracing import RequestTracer, tracer_from_env
from minedraft.worker.settings import env

_DEFAULTS = {f.name: f.default for f in fields(ManagerConfig)}


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    """One flag per live policy field (`--max-num-seqs`, env MINEDRAFT_MAX_NUM_SEQS, ...): the
    starting policy, which PUT /admin/policy may change later."""
    for f in POLICY_FIELDS:
        env_name = f.name.upper()
        p.add_argument(f"--{f.name.replace('_', '-')}", type=f.type, choices=f.choices,
                       default=f.type(env(env_name, str(_DEFAULTS[f.name]))),
                       help=f"{f.description} [MINEDRAFT_{env_name}]")


def add_manager_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=env("HOST", "127.0.0.1"), help="bind address [MINEDRAFT_HOST]")
    p.add_argument("--grpc-port", type=int, default=int(env("GRPC_PORT", "50051")), help="[MINEDRAFT_GRPC_PORT]")
    p.add_argument("--http-port", type=int, default=int(env("HTTP_PORT", "8000")), help="[MINEDRAFT_HTTP_PORT]")
    p.add_argument("--admin-port", type=int, default=int(env("ADMIN_PORT", "0")),
                   help="serve /admin/* and /health on this port only; 0 = on the HTTP port [MINEDRAFT_ADMIN_PORT]")
    add_policy_flags(p)
    p.add_argument("--max-queue", type=int, default=int(env("MAX_QUEUE", str(_DEFAULTS["max_queue"]))),
                   help="waiting requests before 429 [MINEDRAFT_MAX_QUEUE]")
    p.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=env("METRICS", "1") != "0",
                   help="Prometheus /metrics on the HTTP port (--no-metrics: none, no recording) [MINEDRAFT_METRICS]")
    p.add_argument("--data-plane-backend", choices=DATA_PLANE_BACKENDS, default=env("DATA_PLANE_BACKEND", "gloo"),
                   help="gloo (CPU) or nccl (GPU) [MINEDRAFT_DATA_PLANE_BACKEND]")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batch-manager", help="run the batch manager (public APIs, step driver)")
    add_manager_flags(p)
    p.add_argument("--tokenizer", default=env("TOKENIZER", str(TINY_TARGET)),
                   help="folder with tokenizer.json (usually the verifier's model) [MINEDRAFT_TOKENIZER]")
    p.add_argument("--served-model-name", default=env("SERVED_MODEL_NAME", ""),
                   help="model name in the APIs (default: the tokenizer folder's name) [MINEDRAFT_SERVED_MODEL_NAME]")
    p.add_argument("--verifier-address", default=env("VERIFIER_ADDRESS", "127.0.0.1:50061"),
                   help="verifier rank 0's control address [MINEDRAFT_VERIFIER_ADDRESS]")
    p.add_argument("--draft-address", default=env("DRAFT_ADDRESS", "127.0.0.1:50062"),
                   help="draft service control address; empty for none [MINEDRAFT_DRAFT_ADDRESS]")
    p.set_defaults(run=run)


def manager_config(args: argparse.Namespace) -> ManagerConfig:
    config = ManagerConfig(**{f.name: getattr(args, f.name) for f in POLICY_FIELDS}, max_queue=args.max_queue,
                           data_plane_backend=args.data_plane_backend)
    config.validate()
    return config


def run(args: argparse.Namespace) -> int:
    configure_logging("batch-manager")
    try:
        config = manager_config(args)
    except InvalidRequestError as exc:
        logging.error("invalid setting: %s", exc)
        return 2
    return asyncio.run(serve(args, config))


def _http_server(app: object, host: str, port: int) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))  # type: ignore[arg-type]
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # handled in serve()
    return server


async def serve(args: argparse.Namespace, config: ManagerConfig) -> int:
    tokenizer = Tokenizer(args.tokenizer)
    name = args.served_model_name or Path(args.tokenizer).name
    coordinator = Coordinator.over_grpc(tokenizer, name, args.verifier_address, args.draft_address or None, config)
    metrics = ServingMetrics(name, coordinator.status) if args.metrics else None
    if metrics is not None:
        coordinator.driver.observer = MetricsObserver(metrics)
    traced = tracer_from_env("minedraft-batch-manager")
    tracer = RequestTracer(traced, name) if traced is not None else None
    await coordinator.start()  # listen only once both workers answered and the data plane formed
    grpc_server = build_grpc_server(coordinator, args.host, args.grpc_port, tracer)
    await grpc_server.start()
    public = build_http_app(coordinator, serve_health=not args.admin_port, tracer=tracer,
                            metrics=metrics.registry if metrics is not None else None)
    servers = [_http_server(public, args.host, args.http_port)]
    if args.admin_port:
        servers.append(_http_server(build_admin_app(coordinator), args.host, args.admin_port))
    else:
        install_admin_routes(public, coordinator)
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    logging.info("batch manager ready: gRPC %s:%d, HTTP http://%s:%d, admin on port %d (mode %s)", args.host,
                 grpc_server.port, args.host, args.http_port, args.admin_port or args.http_port, config.mode)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.info("draining: refusing new requests")
    for server in servers:
        server.should_exit = True
    await grpc_server.stop(grace=5)
    await asyncio.gather(*tasks)
    await coordinator.stop()
    return 0
