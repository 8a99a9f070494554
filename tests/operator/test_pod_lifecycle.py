"""The generated CPU pod through a lost draft and through its own deletion, run as local processes.

With routing.readyWithoutDraft the pod stays Ready while its draft service is gone and serves the same
tokens without drafts, then speculates again once the supervisor has restarted the draft. Deleting it
follows the kubelet: the batch manager's preStop sleep (still serving: gateways drop the pod meanwhile),
then SIGTERM, its drain (a running stream finishes, new requests get 503), every container exits 0 and
the port refuses connections. The drain test runs last: it ends the module's pod.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from tests.conftest import wait_until
from tests.operator.conftest import cpu_pod_resource, local_cpu_pod
from tests.operator.pod_runner import HOST, LocalPod, free_ports, http, probe_ok

PRE_STOP_S = 1
STREAMS = 3  # beside each other, so each is still running after the preStop on a fast machine too
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPod]:
    mdd = cpu_pod_resource(free_ports(7))
    mdd["spec"].update(routing={"readyWithoutDraft": True}, preStopSeconds=PRE_STOP_S, drainSeconds=30)
    with local_cpu_pod(mdd, tmp_path_factory.mktemp("pod-lifecycle")) as local:
        yield local


def base(pod: LocalPod) -> str:
    return f"http://{HOST}:{pod.port('batch-manager', 'http')}"


def health(pod: LocalPod) -> tuple[int, Any]:
    return http("GET", f"http://{HOST}:{pod.port('batch-manager', 'admin')}/health")


def body(max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {"model": "tiny-target", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def text_of(pod: LocalPod, max_tokens: int) -> str:
    status, reply = http("POST", f"{base(pod)}/v1/completions", body(max_tokens))
    assert status == 200, reply
    return str(reply["choices"][0]["text"])


def pod_ready(pod: LocalPod) -> bool:
    """The pod's Ready condition now: every container runs and passes its readiness probe, if it has one."""
    running = all(proc.poll() is None for proc in pod.procs.values())
    return running and all(probe_ok(c["readinessProbe"]) for c in pod.template["spec"]["containers"]
                           if "readinessProbe" in c)


def fallback_gauge(pod: LocalPod) -> float:
    metrics = httpx.get(f"{base(pod)}/metrics", timeout=10).text
    line = next(m for m in metrics.splitlines() if m.startswith("minedraft:speculation_fallback_active{"))
    return float(line.rsplit(" ", 1)[1])


def test_losing_the_draft_keeps_the_pod_ready_and_its_output_exact(pod: LocalPod) -> None:
    expected = text_of(pod, 40)
    assert health(pod)[1]["draft_connected"] is True and fallback_gauge(pod) == 0.0
    supervisor = psutil.Process(pod.procs["draft"].pid)
    (draft,) = supervisor.children()
    draft.kill()
    wait_until(lambda: health(pod)[1]["draft_connected"] is False, timeout=30)
    status, during = health(pod)
    assert status == 200 and during["status"] == "degraded", during
    assert pod_ready(pod), "the draft container still runs (its supervisor) and the batch manager is ready"
    assert fallback_gauge(pod) == 1.0
    assert text_of(pod, 40) == expected, "without drafts the replica serves the same tokens"
    wait_until(lambda: health(pod)[1]["draft_connected"] is True, timeout=90)
    (restarted,) = supervisor.children()
    assert restarted.pid != draft.pid and supervisor.is_running()
    assert pod_ready(pod) and fallback_gauge(pod) == 0.0
    drafted = health(pod)[1]["drafted_total"]
    assert text_of(pod, 40) == expected
    assert health(pod)[1]["drafted_total"] > drafted, "speculation is back"


def stream_tokens(pod: LocalPod, max_tokens: int, stamps: list[tuple[float, str]], done: list[str]) -> None:
    """Read a streamed completion, stamping each piece of text with its arrival time."""
    with httpx.stream("POST", f"{base(pod)}/v1/completions", json=body(max_tokens, stream=True),
                      timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: "):])["choices"][0]
            stamps.append((time.monotonic(), choice["text"]))
            if choice.get("finish_reason"):
                done.append(choice["finish_reason"])


def refused(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def test_deletion_drains_a_running_stream_refuses_new_requests_and_exits_0(pod: LocalPod) -> None:
    max_tokens = 900
    expected = text_of(pod, max_tokens)
    stamps: list[list[tuple[float, str]]] = [[] for _ in range(STREAMS)]
    done: list[list[str]] = [[] for _ in range(STREAMS)]
    readers = [threading.Thread(target=stream_tokens, args=(pod, max_tokens, stamps[i], done[i]))
               for i in range(STREAMS)]
    for reader in readers:
        reader.start()
    wait_until(lambda: all(stamps), timeout=30)
    codes: dict[str, int] = {}
    deleted = time.monotonic()
    terminator = threading.Thread(target=lambda: codes.update(pod.terminate()))
    terminator.start()
    # preStop: the workers already have SIGTERM, the batch manager has not; it goes on serving new requests.
    time.sleep(0.2)
    assert health(pod)[0] == 200 and expected.startswith(text_of(pod, 4))
    assert time.monotonic() - deleted < PRE_STOP_S, "checked inside the preStop window"
    wait_until(lambda: health(pod)[0] == 503, timeout=PRE_STOP_S + 10)
    status, reply = http("POST", f"{base(pod)}/v1/completions", body(4))
    assert status == 503, reply
    for reader in readers:
        reader.join(120)
    terminator.join(60)
    assert done == [["length"]] * STREAMS
    assert ["".join(text for _, text in pieces) for pieces in stamps] == [expected] * STREAMS
    assert all(pieces[-1][0] > deleted + PRE_STOP_S for pieces in stamps), "the streams ran past SIGTERM"
    assert codes == dict.fromkeys(pod.procs, 0), {n: pod.log(n) for n, c in codes.items() if c}
    assert refused(pod.port("batch-manager", "http"))
