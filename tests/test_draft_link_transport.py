"""What the draft link runs over: NCCL's report parsed, its log found, and the transport a
formed data plane reports (gloo on CPU; over NCCL on two GPUs when there are two)."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from minedraft.worker.nccl_report import UNKNOWN, NcclLog, expand_debug_file, transport_from_nccl_log

# Lines as NCCL 2.2x writes them with NCCL_DEBUG=INFO (host:pid:tid [cuda device] NCCL INFO ...).
P2P_RUN = [
    "h200-0:5120:5301 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.4<0>",
    "h200-0:5120:5301 [0] NCCL INFO NCCL version 2.27.7+cuda13.0",
    "h200-0:5120:5301 [0] NCCL INFO P2P Chunksize set to 131072",
    "h200-0:5120:5388 [0] NCCL INFO Channel 00/1 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "h200-0:5120:5388 [0] NCCL INFO Channel 01/1 : 1[1] -> 0[0] via P2P/CUMEM/read",
    "h200-0:5120:5301 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
]
SHM_RUN = ["node:77:90 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct",
           "node:77:90 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct"]
NET_RUN = ["node:77:90 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
           "node:77:91 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA"]


@pytest.mark.parametrize(("lines", "expected"), [
    (P2P_RUN, "P2P"),
    (SHM_RUN, "SHM"),
    (NET_RUN, "NET"),
    (P2P_RUN + SHM_RUN, "P2P,SHM"),  # one direction each way: both are reported
    (P2P_RUN[:3], ""),  # connected lazily: nothing said yet
    (["a line that mentions via P2P but is not NCCL's"], ""),
])
def test_the_transport_is_read_from_nccls_channel_lines(lines: list[str], expected: str) -> None:
    assert transport_from_nccl_log(lines) == expected


def test_nccl_is_pointed_at_a_readable_log_only_when_the_user_did_not_ask_for_one() -> None:
    env: dict[str, str] = {}
    log = NcclLog.configure(env)
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,P2P,NET"
    assert log.path is not None and env["NCCL_DEBUG_FILE"] == str(log.path)
    mine = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/var/log/nccl.%h.%p"}
    assert NcclLog.configure(mine).path == expand_debug_file(mine["NCCL_DEBUG_FILE"], os.getpid(), os.uname()[1])
    assert mine == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/var/log/nccl.%h.%p"}  # left as the user set it
    assert expand_debug_file("/x/nccl.%h.%p.log", 42, "node7") == Path("/x/nccl.node7.42.log")


def test_only_lines_appended_since_the_mark_count(tmp_path: Path) -> None:
    """The verifier's tensor-parallel group writes P2P lines too: those before the data plane are not its."""
    log = NcclLog(tmp_path / "nccl.log")
    assert log.mark() == 0 and log.transport_since(0) == UNKNOWN  # no log yet
    log.path.write_text("\n".join(P2P_RUN) + "\n")
    start = log.mark()
    with log.path.open("a") as fh:
        fh.write("\n".join(SHM_RUN) + "\n")
    assert log.transport_since(start) == "SHM"
    assert log.transport_since(log.mark()) == UNKNOWN


def _nccl_rank(rank: int, port: int, out: mp.Queue) -> None:
    from minedraft.worker.data_plane import DataPlane
    from minedraft.worker.rendezvous import host_store

    torch.cuda.set_device(rank)
    import torch.distributed as dist

    store = host_store("127.0.0.1", port) if rank == 0 else dist.TCPStore("127.0.0.1", port, is_master=False)
    plane = DataPlane(rank, 1, store, "nccl", torch.device(f"cuda:{rank}"))
    out.put((rank, plane.transport))
    plane.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpus_report_what_nccl_chose() -> None:
    from minedraft.cli.local_stack import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_nccl_rank, args=(rank, port, out)) for rank in (0, 1)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    print(f"draft link transport over NCCL: {got}")
    assert got[0] in ("P2P", "SHM", "NET") and got[0] == got[1]
