"""`minedraft batch-manager`: public gRPC + HTTP APIs over the two workers.

Listens only once both workers answered and the data plane formed. SIGTERM or SIGINT is a
drain: health reports NOT_SERVING / 503, new requests get 503 / UNAVAILABLE, requests in
flight finish (up to --drain-grace-s, then they are aborted), the listeners close, and the
workers' streams are closed last, which lets draining workers exit. A second signal cuts
the grace short.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from dataclasses import fields
from pathlib import Path

import uvicorn

from minedraft.batch_manager.admin_api import build_admin_app
from minedraft.batch_manager.config import DATA_PLANE_BACKENDS, ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.batch_manager.grpc_api import build_grpc_server
from minedraft.batch_manager.http_api import build_http_app
from minedraft.batch_manager.policy import POLICY_FIELDS
from minedraft.batch_manager.server_flags import ServingOptions, add_prompt_flags, add_serving_flags
from minedraft.batch_manager.step_observer import MetricsObserver
from minedraft.bundled import TINY_TARGET
from minedraft.core.errors import InvalidRequestError
from minedraft.core.tokenizer import Tokenizer
from minedraft.observability.logs import configure_logging
from minedraft.observability.metrics import ServingMetrics
from minedraft.observability.tracing import RequestTracer, tracer_from_env
from minedraft.worker.settings import env

_DEFAULTS = {f.name: f.default for f in fields(ManagerConfig)}
FLUSH_S = 3  # after the drain, how long responses may take to reach their clients


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
    add_serving_flags(p)
    add_policy_flags(p)
    p.add_argument("--max-queue", type=int, default=int(env("MAX_QUEUE", str(_DEFAULTS["max_queue"]))),
                   help="waiting requests before 429 [MINEDRAFT_MAX_QUEUE]")
    p.add_argument("--stream-interval", type=int, default=int(env("STREAM_INTERVAL", "1")),
                   help="tokens a streamed chunk waits for (the first and the last go at once); > 1 spends less "
                        "of the batch manager's CPU per token on many streams, in coarser chunks "
                        "[MINEDRAFT_STREAM_INTERVAL]")
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
    add_prompt_flags(p)
    p.add_argument("--draft-stand-in", action=argparse.BooleanOptionalAction,
                   default=env("DRAFT_STAND_IN", "0") != "0",
                   help="the verifier also loaded the draft model (--colocated-draft): keep the draft service and "
                        "let the verifier draft (fused SD) while the service is lost, instead of plain decoding "
                        "[MINEDRAFT_DRAFT_STAND_IN]")
    p.set_defaults(run=run)


def manager_config(args: argparse.Namespace) -> ManagerConfig:
    config = ManagerConfig(**{f.name: getattr(args, f.name) for f in POLICY_FIELDS}, max_queue=args.max_queue,
                           data_plane_backend=args.data_plane_backend, stream_interval=args.stream_interval,
                           draft_stand_in=args.draft_stand_in, enable_prefix_caching=args.enable_prefix_caching,
                           max_num_batched_tokens=args.max_num_batched_tokens)
    config.validate()
    return config


def run(args: argparse.Namespace) -> int:
    configure_logging("batch-manager")
    try:
        config = manager_config(args)
        options = ServingOptions.from_args(args)
    except InvalidRequestError as exc:
        logging.error("invalid setting: %s", exc)
        return 2
    return asyncio.run(serve(args, config, options))


def _http_server(app: object, host: str, port: int, **tls: str) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",  # type: ignore[arg-type]
                                           timeout_graceful_shutdown=FLUSH_S, **tls))  # type: ignore[arg-type]
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # signals are serve()'s
    return server


def _signals(coordinator: Coordinator) -> asyncio.Event:
    """SIGTERM / SIGINT set the returned event; a second one aborts what is still running."""
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            logging.warning("second signal: aborting the requests still running")
            coordinator.driver.abort_everything()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    return stop


async def serve(args: argparse.Namespace, config: ManagerConfig, options: ServingOptions | None = None) -> int:
    options = options or ServingOptions.from_args(args)
    tokenizer = Tokenizer(args.tokenizer)
    name = args.served_model_name or Path(args.tokenizer).name
    coordinator = Coordinator.over_grpc(tokenizer, name, args.verifier_address, args.draft_address or None, config)
    metrics = ServingMetrics(name, coordinator.status) if args.metrics else None
    if metrics is not None:
        coordinator.driver.observer = MetricsObserver(metrics)
    traced = tracer_from_env("minedraft-batch-manager")
    tracer = RequestTracer(traced, name) if traced is not None else None
    stop = _signals(coordinator)
    starting = asyncio.create_task(coordinator.start())  # listen only once both workers answered
    await asyncio.wait({starting, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # stopped while waiting for the workers: nothing to drain
        starting.cancel()
        await coordinator.stop()
        return 0
    starting.result()
    grpc_server = build_grpc_server(coordinator, args.host, args.grpc_port, tracer, options.api_keys,
                                    options.max_request_bytes, options.grpc_credentials())
    await grpc_server.start()
    public = build_http_app(coordinator, tracer=tracer, metrics=metrics.registry if metrics is not None else None,
                            api_keys=options.api_keys, max_request_bytes=options.max_request_bytes)
    servers = [_http_server(public, args.host, args.http_port, **options.uvicorn_tls())]
    if args.admin_port:
        if not options.admin_keys and args.admin_host not in ("127.0.0.1", "::1", "localhost"):
            logging.warning("the admin API on %s:%d has no key: anyone who reaches it can change the policy "
                            "(set MINEDRAFT_ADMIN_API_KEY or MINEDRAFT_ADMIN_API_KEY_FILE)", args.admin_host,
                            args.admin_port)
        servers.append(_http_server(build_admin_app(coordinator, options.admin_keys), args.admin_host,
                                    args.admin_port))
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    admin = f"http://{args.admin_host}:{args.admin_port}" if args.admin_port else "off"
    logging.info("batch manager ready: gRPC %s:%d, HTTP %s://%s:%d, admin %s, API keys %s (mode %s)", args.host,
                 grpc_server.port, "https" if options.tls else "http", args.host, args.http_port, admin,
                 len(options.api_keys) or "off", config.mode)
    ended = {asyncio.create_task(stop.wait()), asyncio.create_task(coordinator.loop_failed.wait())}
    _, waiting = await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
    for task in waiting:
        task.cancel()
    if not coordinator.failure:
        logging.info("draining: refusing new requests, finishing %d running and %d waiting (grace %.0f s)",
                     len(coordinator.driver.requests), len(coordinator.admission.waiting), options.drain_grace_s)
        await grpc_server.not_serving()
        took = await coordinator.drain(options.drain_grace_s)
        logging.info("drained in %.2f s; closing the listeners and the workers' streams", took)
    for server in servers:
        server.should_exit = True
    await grpc_server.stop(grace=FLUSH_S)
    await asyncio.gather(*tasks)
    await coordinator.stop()
    if coordinator.failure:
        logging.error("%s: exiting with status 1 so the process is restarted", coordinator.failure)
        return 1
    return 0
