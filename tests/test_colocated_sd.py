"""SD colocated: the verifier loads the draft model itself (--colocated-draft) and runs standard SD
without a draft service; a draft service on the verifier's GPU is refused at start-up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.bench.client import put_policy
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.errors import ModelLoadError
from minedraft.core.sampling_params import SamplingParams
from minedraft.proto import control_pb2
from minedraft.worker.placement import COLOCATED_VERIFIER_ROLE, draft_on_verifier_gpu, physical_gpu
from tests.conftest import engine_from_folders, grpc_stream, worker_info
from tests.fake_worker_links import FakeDraft, FakeVerifier, fake_pair
from tests.step_driver_support import word_tokenizer

UUID_A = "GPU-0b5c7e52-aaaa-bbbb-cccc-000000000001"
UUID_B = "GPU-0b5c7e52-aaaa-bbbb-cccc-000000000002"


def test_physical_gpu_compares_uuids_not_process_local_indices() -> None:
    assert physical_gpu(f"cuda:1 {UUID_A}") == UUID_A
    assert physical_gpu("cpu") is None and physical_gpu("cuda:0") is None
    assert draft_on_verifier_gpu(f"cuda:0 {UUID_A}", f"cuda:3 {UUID_A}")  # one GPU seen by two processes
    assert not draft_on_verifier_gpu(f"cuda:0 {UUID_A}", f"cuda:0 {UUID_B}")  # cuda:0 of two processes
    assert not draft_on_verifier_gpu("cpu", "cpu")  # gloo links two CPU processes fine


class OnDevice:
    """Makes a fake worker report a device, as the real executors do."""

    def __init__(self, worker: FakeVerifier | FakeDraft, device: str) -> None:
        self.worker, self.device = worker, device
        self.original = worker.info

    async def info(self, timeout: float = 5.0) -> control_pb2.WorkerInfo:
        info = await self.original(timeout)
        info.device = self.device
        return info


def pair_on_gpus(tmp_path: Path, verifier_gpu: str, draft_gpu: str) -> tuple[Coordinator, FakeDraft]:
    """A PSD manager over fake workers that report these GPU UUIDs."""
    verifier, draft = fake_pair(lambda seq, step: 99)
    assert draft is not None
    verifier.info = OnDevice(verifier, f"cuda:0 {verifier_gpu}").info  # type: ignore[method-assign]
    draft.info = OnDevice(draft, f"cuda:0 {draft_gpu}").info  # type: ignore[method-assign]
    return Coordinator(word_tokenizer(tmp_path / "tok"), "fake", verifier, draft, ManagerConfig(mode="psd")), draft


def test_draft_service_on_the_verifier_gpu_is_refused_at_start_up(tmp_path: Path) -> None:
    coordinator, draft = pair_on_gpus(tmp_path, UUID_A, UUID_A)
    with pytest.raises(ModelLoadError, match=r"draft service runs on the verifier's GPU.*--colocated-draft"):
        asyncio.run(coordinator.start(connect_timeout=2))
    assert draft.setups == []  # refused before any data plane was tried


def test_draft_service_on_another_gpu_forms_the_data_plane(tmp_path: Path) -> None:
    coordinator, _ = pair_on_gpus(tmp_path, UUID_A, UUID_B)

    async def start_and_stop() -> str:
        await coordinator.start(connect_timeout=2)
        state = coordinator.status()["draft_state"]
        await coordinator.stop()
        return str(state)

    assert asyncio.run(start_and_stop()) == "drafting"


@pytest.fixture(scope="module")
def colocated(random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    """Verifier (with a draft model loaded beside the target) and batch manager; no draft service
    (the manager's --draft-address points at a port nobody serves). The draft is the target's own
    folder: every draft should be accepted, which shows the drafts really are judged and committed."""
    target, draft = random_pair
    cfg = StackConfig(target=str(target), draft=str(draft), grpc_port=free_port(), http_port=free_port(), mode="sd",
                      k=3, num_blocks=512, log_dir=tmp_path_factory.mktemp("logs"),
                      process_env={"verifier": {"MINEDRAFT_COLOCATED_DRAFT": str(target)}})
    stack = LocalStack(cfg)
    stack.start_verifier()
    stack.start_manager()
    try:
        stack.wait_ready(120)
        yield stack
    finally:
        stack.stop()


def ar_reference(random_pair: tuple[Path, Path], prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    engine = engine_from_folders(random_pair[0], None, "ar", block_size=16, num_blocks=512)
    params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True) for _ in prompts]
    return [r.output_ids for r in engine.generate(prompts, params)]


def health(stack: LocalStack) -> dict:
    return httpx.get(f"http://127.0.0.1:{stack.cfg.http_port}/health", timeout=5).json()


def run_batch(stack: LocalStack, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    async def run_all() -> list[list[int]]:
        return await asyncio.gather(*(grpc_stream(stack, p, max_tokens, 0.0) for p in prompts))

    return asyncio.run(run_all())


PROMPTS = [[(5 * i + j) % 90 + 2 for j in range(4 + i % 5)] for i in range(6)]


def test_colocated_verifier_reports_its_role(colocated: LocalStack) -> None:
    info = worker_info(colocated.target_port)
    assert info.role == COLOCATED_VERIFIER_ROLE
    assert info.device == "cpu"
    status = health(colocated)
    assert status["draft_state"] == "drafting" and status["draft_link_transport"] == "colocated"


@pytest.mark.parametrize(("mode", "k"), [("sd", 3), ("psd", 2), ("ar", 2)])
def test_colocated_greedy_output_equals_ar_token_for_token(colocated: LocalStack, random_pair, mode: str,
                                                           k: int) -> None:
    put_policy(colocated.admin_port, mode=mode, k=k)
    before = health(colocated)
    got = run_batch(colocated, PROMPTS, 24)
    after = health(colocated)
    assert got == ar_reference(random_pair, PROMPTS, 24)
    drafted = after["drafted_total"] - before["drafted_total"]
    steps = {kind: after["steps_by_kind"][kind] - before["steps_by_kind"][kind] for kind in ("psd", "sd", "ar")}
    if mode == "ar":
        assert drafted == 0 and steps["ar"] > 0
    else:
        accepted = after["accepted_total"] - before["accepted_total"]
        assert drafted > 0 and accepted >= 0.9 * drafted  # self-drafting: (nearly) every draft accepted
        assert steps[mode] > 0 and steps["ar"] == 0
    if mode == "sd":  # fused: a plan verifies what the plan before drafted, then drafts again
        verifies = after["timing_totals"]["verify_busy_steps"] - before["timing_totals"].get("verify_busy_steps", 0)
        assert verifies >= 0.8 * steps["sd"]  # alternating draft and verify plans would verify in half of them
    assert worker_info(colocated.target_port).sequences == 0  # every sequence left the verifier



def test_colocated_auto_chooses_k_on_one_fused_batch_and_stays_exact(colocated: LocalStack, random_pair) -> None:
    put_policy(colocated.admin_port, mode="auto", k=3)
    before = health(colocated)
    got = run_batch(colocated, PROMPTS, 24)
    after = health(colocated)
    put_policy(colocated.admin_port, mode="sd", k=3)
    assert got == ar_reference(random_pair, PROMPTS, 24)
    steps = {kind: after["steps_by_kind"][kind] - before["steps_by_kind"][kind] for kind in ("psd", "sd", "ar")}
    assert steps["psd"] == 0 and steps["sd"] > 0  # one batch: a colocated verifier cannot overlap two
    chosen = after["adaptive_k"]["plans_by_k"]
    assert chosen and all(1 <= int(k) <= 3 for k in chosen)
    assert after["drafted_total"] > before["drafted_total"]
