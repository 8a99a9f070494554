"""The batch manager's listener settings: admin listener, API keys, limits, drain, TLS.

Each flag has a MINEDRAFT_* environment default (what a pod sets). Keys are better passed
through the environment or a file than as flags, which any local user can read in `ps`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import grpc

from minedraft.batch_manager.api_keys import ApiKeys
from minedraft.batch_manager.http_guards import DEFAULT_MAX_REQUEST_BYTES
from minedraft.core.errors import InvalidRequestError
from minedraft.worker.settings import env

DEFAULT_ADMIN_PORT = 8081
DEFAULT_DRAIN_GRACE_S = 25.0  # with a 5 s preStop, inside Kubernetes' default 30 s termination grace


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--admin-port", type=int, default=int(env("ADMIN_PORT", str(DEFAULT_ADMIN_PORT))),
                   help="port of the admin API (/admin/policy, /health), never the public one; 0 = no admin API "
                        "[MINEDRAFT_ADMIN_PORT]")
    p.add_argument("--admin-host", default=env("ADMIN_HOST", "127.0.0.1"),
                   help="bind address of the admin API: loopback by default; 0.0.0.0 in a pod, for the operator "
                        "[MINEDRAFT_ADMIN_HOST]")
    p.add_argument("--api-key", default=env("API_KEY", ""),
                   help="accepted API keys, comma-separated (Authorization: Bearer <key>); none = no check "
                        "[MINEDRAFT_API_KEY]")
    p.add_argument("--api-key-file", default=env("API_KEY_FILE", ""),
                   help="file with one accepted API key per line, e.g. a mounted Secret [MINEDRAFT_API_KEY_FILE]")
    p.add_argument("--admin-api-key", default=env("ADMIN_API_KEY", ""),
                   help="keys of the admin API, comma-separated; none = no check [MINEDRAFT_ADMIN_API_KEY]")
    p.add_argument("--admin-api-key-file", default=env("ADMIN_API_KEY_FILE", ""),
                   help="file with one admin key per line [MINEDRAFT_ADMIN_API_KEY_FILE]")
    p.add_argument("--max-request-bytes", type=int,
                   default=int(env("MAX_REQUEST_BYTES", str(DEFAULT_MAX_REQUEST_BYTES))),
                   help="largest request body (HTTP) or message (gRPC); larger ones get 413 / RESOURCE_EXHAUSTED "
                        "before they are parsed [MINEDRAFT_MAX_REQUEST_BYTES]")
    p.add_argument("--drain-grace-s", type=float, default=float(env("DRAIN_GRACE_S", str(DEFAULT_DRAIN_GRACE_S))),
                   help="on SIGTERM, seconds requests in flight may take to finish before they are aborted "
                        "[MINEDRAFT_DRAIN_GRACE_S]")
    p.add_argument("--tls-cert-file", default=env("TLS_CERT_FILE", ""),
                   help="PEM certificate (chain) of the public gRPC and HTTP listeners; TLS is off without it "
                        "[MINEDRAFT_TLS_CERT_FILE]")
    p.add_argument("--tls-key-file", default=env("TLS_KEY_FILE", ""),
                   help="PEM private key of that certificate [MINEDRAFT_TLS_KEY_FILE]")


def add_prompt_flags(p: argparse.ArgumentParser) -> None:
    """vLLM's names, so a vLLM command line carries over."""
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=env("ENABLE_PREFIX_CACHING", "1") not in ("0", "false", "False"),
                   help="reuse the KV of prompt prefixes computed before, on both workers (on by default; "
                        "--no-enable-prefix-caching: off) [MINEDRAFT_ENABLE_PREFIX_CACHING]")
    p.add_argument("--max-num-batched-tokens", type=int, default=int(env("MAX_NUM_BATCHED_TOKENS", "0")),
                   help="tokens the verifier computes per step, verify rows and prompt chunks together; long "
                        "prompts are split to keep within it; 0: 96 on a CPU, 2048 on a GPU "
                        "[MINEDRAFT_MAX_NUM_BATCHED_TOKENS]")


@dataclass(frozen=True, slots=True)
class ServingOptions:
    """What the flags above resolve to."""

    api_keys: ApiKeys
    admin_keys: ApiKeys
    max_request_bytes: int
    drain_grace_s: float
    tls_cert_file: str
    tls_key_file: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServingOptions:
        """Raises InvalidRequestError for a setting that cannot work (a missing file, half a TLS pair)."""
        if bool(args.tls_cert_file) != bool(args.tls_key_file):
            raise InvalidRequestError("TLS needs both --tls-cert-file and --tls-key-file")
        for name in (args.tls_cert_file, args.tls_key_file):
            if name and not Path(name).is_file():
                raise InvalidRequestError(f"TLS file {name} does not exist")
        if args.max_request_bytes < 1024 or args.drain_grace_s < 0:
            raise InvalidRequestError("max_request_bytes must be >= 1024 and drain_grace_s >= 0")
        return cls(ApiKeys.load(args.api_key, [args.api_key_file]),
                   ApiKeys.load(args.admin_api_key, [args.admin_api_key_file]),
                   args.max_request_bytes, args.drain_grace_s, args.tls_cert_file, args.tls_key_file)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)

    def grpc_credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        pair = (Path(self.tls_key_file).read_bytes(), Path(self.tls_cert_file).read_bytes())
        return grpc.ssl_server_credentials([pair])

    def uvicorn_tls(self) -> dict[str, str]:
        return {"ssl_certfile": self.tls_cert_file, "ssl_keyfile": self.tls_key_file} if self.tls else {}
