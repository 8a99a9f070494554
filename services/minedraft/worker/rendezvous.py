"""The verifier's rendezvous store, shared by the data plane (every epoch) and the tensor-parallel group,
and the bare process groups both build on it."""

from __future__ import annotations

import socket
from datetime import timedelta

import torch.distributed as dist


def host_store(host: str, port: int, timeout_s: float = 30.0) -> dist.TCPStore:
    """The verifier's long-lived rendezvous store, listening on `host` only (port 0 picks a free port).

    torch's TCPStore server binds every interface whatever host it is given, so the socket is
    bound here and handed over (`master_listen_fd`): with the default 127.0.0.1 nothing outside
    the machine (the pod) can reach it. `store.port` is the port it really listens on.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=128)
    bound = sock.getsockname()[1]
    return dist.TCPStore(host, bound, world_size=None, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False, master_listen_fd=sock.detach())


def bare_group(backend: str, store: dist.Store, rank: int, size: int, timeout: timedelta,
               name: str = "") -> dist.ProcessGroup:
    """A process group of its own on `store` ("nccl": ProcessGroupNCCL, else ProcessGroupGloo), outside
    torch.distributed's registry, so it lives beside others and is dropped (or aborted) without touching any
    global state. `name` names an NCCL group's logs and watchdog."""
    if backend != "nccl":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = False
    options._timeout = timeout
    if name:
        options.group_name = name
    return dist.ProcessGroupNCCL(store, rank, size, options)
