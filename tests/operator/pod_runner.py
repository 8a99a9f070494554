"""Runs a rendered pod template on this machine: each container's command, args and env as a process.

This is the "pod runs" check without a cluster: only what the template declares is used (the
container's own environment, not the test's; its probes; its declared ports), with volume mount
paths mapped to local folders. A wrong flag, env name, port or path in the template fails here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.operator import secret_volume

HOST = "127.0.0.1"  # the pod IP, seen from inside this machine
# The image puts its venv on PATH; here the test's venv stands in for it.
PATH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def http(method: str, url: str, body: dict[str, Any] | None = None, key: str | None = None) -> tuple[int, Any]:
    """One JSON call; `key` goes out as `Authorization: Bearer <key>` (what the operator sends)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def complete(http_port: int, max_tokens: int = 12) -> dict[str, Any]:
    """A greedy completion through the pod's OpenAI port."""
    base = f"http://{HOST}:{http_port}"
    status, models = http("GET", f"{base}/v1/models")
    assert status == 200, models
    status, reply = http("POST", f"{base}/v1/completions", {
        "model": models["data"][0]["id"], "prompt": "Once upon a time", "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True})
    assert status == 200, reply
    return reply


def probe_ok(probe: dict[str, Any]) -> bool:
    """One attempt of a kubelet probe (grpc, httpGet or tcpSocket) against the pod IP."""
    try:
        if "grpc" in probe:
            with grpc.insecure_channel(f"{HOST}:{probe['grpc']['port']}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                reply = stub.Check(health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")),
                                   timeout=probe.get("timeoutSeconds", 1))
                return reply.status == health_pb2.HealthCheckResponse.SERVING
        if "httpGet" in probe:
            get = probe["httpGet"]
            url = f"http://{HOST}:{get['port']}{get.get('path', '/')}"
            with urllib.request.urlopen(url, timeout=probe.get("timeoutSeconds", 1)) as reply:
                return 200 <= reply.status < 400
        if "tcpSocket" in probe:
            with socket.create_connection((HOST, probe["tcpSocket"]["port"]), timeout=1):
                return True
    except (OSError, grpc.RpcError):
        return False
    raise ValueError(f"unsupported probe {probe}")


@dataclass
class LocalPod:
    """The containers of one pod template as local processes."""

    template: dict[str, Any]
    mounts: dict[str, Path]  # volume name -> local folder
    log_dir: Path
    # Secret name -> key -> value: what `valueFrom.secretKeyRef` and Secret volumes read (the kubelet reads
    # the API's Secret); a Secret volume not in `mounts` is laid out under log_dir/volumes, as the kubelet does.
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    initial_policy: dict[str, Any] = field(default_factory=dict)  # GET /admin/policy once ready

    def container(self, name: str) -> dict[str, Any]:
        return next(c for c in self.template["spec"]["containers"] if c["name"] == name)

    def _local_path(self, container: dict[str, Any], value: str) -> str:
        """Rewrite a path under a volume mount to the local folder mapped to that volume."""
        for mount in container.get("volumeMounts", []):
            root = mount["mountPath"]
            if mount["name"] in self.mounts and (value == root or value.startswith(root + "/")):
                return str(self.mounts[mount["name"]]) + value[len(root):]
        return value

    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        env = {"PATH": PATH, "LANG": "C.UTF-8"}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = self._local_path(container, item["value"])
                continue
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref is None:
                raise ValueError(f"{container['name']}: {item['name']} needs a cluster ({item.get('valueFrom')})")
            # A missing Secret or key keeps the container from starting (CreateContainerConfigError).
            value = self.secrets.get(ref["name"], {}).get(ref["key"])
            if value is None:
                raise ValueError(f"{container['name']}: {item['name']}: Secret {ref['name']!r} key {ref['key']!r} "
                                 "not given to the pod runner")
            env[item["name"]] = value
        return env

    def _secret_volumes(self, secret: str | None = None) -> list[dict[str, Any]]:
        return [v for v in self.template["spec"].get("volumes", []) if "secret" in v
                and (secret is None or v["secret"]["secretName"] == secret)]

    def update_secret(self, name: str, data: dict[str, str]) -> None:
        """Change a Secret: its volumes are rewritten in place, as the kubelet's sync does (env keeps its value)."""
        self.secrets[name] = dict(data)
        for volume in self._secret_volumes(name):
            secret_volume.write(self.mounts[volume["name"]], secret_volume.project(volume, data),
                                volume["secret"].get("defaultMode", 0o644))

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for volume in self._secret_volumes():
            self.mounts.setdefault(volume["name"], self.log_dir / "volumes" / volume["name"])
            if volume["secret"]["secretName"] not in self.secrets:
                raise ValueError(f"volume {volume['name']}: Secret {volume['secret']['secretName']!r} not given "
                                 "to the pod runner")
        for name in {v["secret"]["secretName"] for v in self._secret_volumes()}:
            self.update_secret(name, self.secrets[name])
        for c in self.template["spec"]["containers"]:
            executable = shutil.which(c["command"][0], path=PATH)
            assert executable, f"{c['command'][0]} is not installed here"
            log = open(self.log_dir / f"{c['name']}.log", "wb")  # noqa: SIM115 - the child owns it
            self.procs[c["name"]] = subprocess.Popen([executable, *c["command"][1:], *c.get("args", [])],
                                                     env=self._env(c), stdout=log, stderr=subprocess.STDOUT,
                                                     start_new_session=True, cwd=self.log_dir)

    def _ready(self, c: dict[str, Any], started: set[str]) -> bool:
        name = c["name"]
        if name not in started:
            if "startupProbe" in c and not probe_ok(c["startupProbe"]):
                return False
            started.add(name)
        return "readinessProbe" not in c or probe_ok(c["readinessProbe"])

    def wait_ready(self, timeout_s: float) -> None:
        """Poll the declared probes until every container is ready (the pod's Ready condition)."""
        started: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"container {name} exited with {proc.returncode}:\n{self.log(name)}")
            if all(self._ready(c, started) for c in self.template["spec"]["containers"]):
                return
            time.sleep(0.3)
        raise TimeoutError("pod not ready:\n" + "\n".join(f"--- {n}\n{self.log(n)}" for n in self.procs))

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def port(self, container: str, port_name: str) -> int:
        return next(p["containerPort"] for p in self.container(container)["ports"] if p["name"] == port_name)

    def terminate(self) -> dict[str, int]:
        """Delete the pod as the kubelet does: each container's preStop sleep, then SIGTERM (containers without
        one get it at once) to the container's main process only, SIGKILL for all that still runs in it at
        terminationGracePeriodSeconds. Returns each container's exit status (negative: the signal that ended it)."""
        started = time.monotonic()
        grace = float(self.template["spec"].get("terminationGracePeriodSeconds", 30))
        pending = {c["name"]: c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
                   for c in self.template["spec"]["containers"]}
        while pending:
            for name, pre_stop in list(pending.items()):
                if time.monotonic() - started >= pre_stop:
                    if self.procs[name].poll() is None:
                        self.procs[name].send_signal(signal.SIGTERM)
                    del pending[name]
            time.sleep(0.05)
        codes = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout=max(0.1, started + grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[name] = proc.wait()
        return codes

    def stop(self, grace_s: float = 10.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
