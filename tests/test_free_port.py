"""The launcher's ports: never one the kernel may hand to another socket meanwhile, never one twice."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from minedraft.cli import local_stack
from minedraft.cli.local_stack import free_port


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # still free: nothing holds it


def test_a_port_another_socket_holds_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first = random.Random(7).randrange(max(1024, low - 12000), low)  # the port a Random(7) picks first
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first))
        monkeypatch.setattr(local_stack, "_PICKS", random.Random(7))
        assert free_port() != first
