"""Which transport NCCL chose for the draft link, read from NCCL's own report.

NCCL says how each channel reaches a peer in its INFO log ("Channel 00/0 : 0[0] -> 1[1] via
P2P/CUMEM/read", "... via SHM/direct/direct", "... [send] via NET/Socket/0"); no API tells.
So a worker process points NCCL's debug output at a file it can read (before NCCL's first
use: NCCL reads its settings once per process), notes where the file ends before a data
plane forms, and parses what was appended while it formed. When the user asked for NCCL's
log (NCCL_DEBUG set, no file), the file is mirrored to stderr so nothing they asked for is
lost. Torch-free: the parse is plain text.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, MutableMapping
from pathlib import Path

TRANSPORTS = ("P2P", "SHM", "NET")
_VIA = re.compile(r"\bvia (P2P|SHM|NET)\b")
UNKNOWN = "nccl"  # NCCL formed the group but its report could not be read


def transport_from_nccl_log(lines: Iterable[str]) -> str:
    """"P2P", "SHM" or "NET" from NCCL INFO channel lines; several kinds joined by ","; "" if none."""
    kinds = {m.group(1) for line in lines if "NCCL INFO" in line and (m := _VIA.search(line))}
    return ",".join(k for k in TRANSPORTS if k in kinds)


def expand_debug_file(pattern: str, pid: int, host: str) -> Path:
    """NCCL_DEBUG_FILE's %h (host name) and %p (process id), as NCCL fills them in."""
    return Path(pattern.replace("%h", host).replace("%p", str(pid)))


class NcclLog:
    """This process's NCCL debug log: where it is and what was appended since a mark."""

    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: NCCL writes where this process cannot read (stdout)

    @classmethod
    def configure(cls, env: MutableMapping[str, str] = os.environ) -> NcclLog:
        """Make NCCL report its transports into a readable file; call before NCCL's first use."""
        if env.get("NCCL_DEBUG_FILE"):
            return cls(expand_debug_file(env["NCCL_DEBUG_FILE"], os.getpid(), socket.gethostname()))
        mirror = bool(env.get("NCCL_DEBUG"))  # the user asked for NCCL's log on the console
        if not mirror:
            env["NCCL_DEBUG"] = "INFO"
            env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,P2P,NET")
        path = Path(tempfile.gettempdir()) / f"minedraft-nccl-{os.getpid()}.log"
        env["NCCL_DEBUG_FILE"] = str(path)
        if mirror:
            threading.Thread(target=_mirror, args=(path,), name="nccl-log-mirror", daemon=True).start()
        return cls(path)

    def mark(self) -> int:
        """Where the log ends now."""
        try:
            return self.path.stat().st_size if self.path is not None else 0
        except FileNotFoundError:
            return 0

    def transport_since(self, offset: int) -> str:
        """The transport named by the lines appended after `offset` (UNKNOWN when there are none)."""
        if self.path is None:
            return UNKNOWN
        try:
            with self.path.open("rb") as fh:
                fh.seek(offset)
                text = fh.read().decode(errors="replace")
        except FileNotFoundError:
            return UNKNOWN
        return transport_from_nccl_log(text.splitlines()) or UNKNOWN


_configured: NcclLog | None = None
_lock = threading.Lock()


def nccl_log() -> NcclLog:
    """The process's NcclLog, configured on first call (worker start-up should make that call)."""
    global _configured
    with _lock:
        if _configured is None:
            _configured = NcclLog.configure()
        return _configured


def _mirror(path: Path, poll_s: float = 0.5) -> None:
    """Copy what NCCL appends to `path` to stderr, for as long as the process lives."""
    offset = 0
    while True:
        try:
            with path.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            offset += len(chunk)
            sys.stderr.write(chunk.decode(errors="replace"))
            sys.stderr.flush()
        time.sleep(poll_s)
