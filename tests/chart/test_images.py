"""The four Dockerfiles: hadolint-clean, pinned bases, non-root, no build tools in the final stage,
the batch manager without torch, and a build context that holds what they copy."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.chart.dockerfiles import DOCKER, IMAGES, dockerignore_excludes, stages
from tests.chart.k8s_tools import ROOT, run

PINNED_TAG = re.compile(r"^[\w./-]+:\d+\.\d+\.\d+[\w.-]*$|^[\w./-]+@sha256:[a-f0-9]{64}$")
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|make|cmake|build-essential|[\w.+-]+-dev|git|curl|wget)\b")
# Triton compiles its kernel launcher with the system C compiler at run time (see the Dockerfile).
GPU_RUNTIME_TOOLS = {"gcc", "libc6-dev", "python3-dev"}


def test_hadolint_passes(hadolint: Path) -> None:
    files = [DOCKER / f"{name}.Dockerfile" for name in IMAGES]
    assert sorted(DOCKER.glob("*.Dockerfile")) == sorted(files)
    run([hadolint, "--failure-threshold", "info", *files])


@pytest.mark.parametrize("name", IMAGES)
def test_bases_are_pinned_and_final_stage_is_non_root(name: str) -> None:
    parsed = stages(name)
    assert len(parsed) == 2 and parsed[0].name == "build", "a builder stage, then the final one"
    for stage in parsed:
        assert PINNED_TAG.match(stage.base), f"{name}: base {stage.base} is not pinned to an exact version"
    final = parsed[-1]
    assert final.args("USER") == ["10001:10001"]
    assert [a for a in final.args("COPY") if a.startswith("--from=build")], "final stage copies the build output"
    assert not [a for a in final.args("COPY") if not a.startswith("--from=")], "final stage copies no sources"


@pytest.mark.parametrize("name", IMAGES)
def test_final_stage_has_no_build_tools(name: str) -> None:
    installed = {tool for run_args in stages(name)[-1].args("RUN") for tool in BUILD_TOOLS.findall(run_args)}
    if name == "worker-gpu":
        assert installed == GPU_RUNTIME_TOOLS
        assert "Triton" in (DOCKER / "worker-gpu.Dockerfile").read_text()
    else:
        assert installed == set()


def test_batch_manager_installs_the_torch_free_extra_only() -> None:
    build = stages("batch-manager")[0]
    runs = " ".join(a for stage in stages("batch-manager") for a in stage.args("RUN"))
    commands = [command.strip() for run_args in build.args("RUN") for command in run_args.split("&&")]
    installs = [command for command in commands if "pip install" in command]
    assert installs == ['/opt/minedraft/venv/bin/pip install "$(echo /wheels/minedraft-*.whl)[batch-manager]"']
    assert "torch" not in runs.replace("assert 'torch' not in sys.modules", "")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"] + project["optional-dependencies"]["batch-manager"]:
        assert not re.match(r"(torch|triton|nvidia-|safetensors|numpy)\b", requirement), requirement


def test_workers_pin_torch_and_install_the_worker_extra() -> None:
    cpu_run = " ".join(stages("worker-cpu")[0].args("RUN"))
    assert '--index-url "https://download.pytorch.org/whl/cpu" "torch==2.13.0"' in cpu_run
    gpu_run = " ".join(stages("worker-gpu")[0].args("RUN"))
    assert 'pip install "torch==2.13.0"' in gpu_run
    assert stages("worker-gpu")[-1].base.startswith("nvidia/cuda:13.") and "-runtime-" in stages("worker-gpu")[-1].base
    for name in ("worker-cpu", "worker-gpu"):
        assert '"$(echo /wheels/minedraft-*.whl)[worker]"' in " ".join(stages(name)[0].args("RUN"))


@pytest.mark.parametrize("name", ["batch-manager", "worker-cpu", "worker-gpu"])
def test_images_hold_the_bundled_pair_where_the_crd_expects_it(name: str) -> None:
    build_run = " ".join(stages(name)[0].args("RUN"))
    assert "mkdir /opt/minedraft/models" in build_run and "b.TINY_TARGET, b.TINY_DRAFT" in build_run
    crd = (ROOT / "operator" / "crds" / "minedraft.io_minedraftdeployments.yaml").read_text()
    assert "default: /opt/minedraft/models" in crd


@pytest.mark.parametrize("name", ["worker-cpu", "worker-gpu"])
def test_worker_images_link_every_model_the_crd_may_name_as_bundled(name: str) -> None:
    """Each name of the CRD's bundled enum (the tiny pair and its EAGLE head) is a folder the worker image
    links into bundledModelsDir, from the package's own assets, which the build context keeps."""
    import minedraft.bundled as bundled
    from minedraft_operator.crds.common import BUNDLED_MODELS

    build_run = " ".join(stages(name)[0].args("RUN"))
    linked = re.search(r"for p in \(([^)]*)\)\]", build_run)
    assert linked, build_run
    folders = [getattr(bundled, ref.strip().removeprefix("b.")) for ref in linked.group(1).split(",")]
    assert sorted(f.name for f in folders) == sorted(BUNDLED_MODELS)
    for folder in folders:
        assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file(), folder
        assert not dockerignore_excludes(str(folder.relative_to(ROOT) / "model.safetensors")), folder


def test_wheel_globs_expand() -> None:
    """A glob followed by a quoted extra ("...-*.whl"[x]) never matches: pip gets a literal '*'."""
    for name in IMAGES:
        assert not re.search(r'\*\.whl"\[', (DOCKER / f"{name}.Dockerfile").read_text())


def test_operator_image_runs_the_operator_module() -> None:
    final = stages("operator")[-1]
    assert final.args("ENTRYPOINT") == ['["python", "-m", "minedraft_operator"]']
    assert final.args("EXPOSE") == ["8080"]
    assert (ROOT / "operator" / "pyproject.toml").is_file()


@pytest.mark.parametrize("name", IMAGES)
def test_build_context_holds_what_each_image_copies(name: str) -> None:
    for stage in stages(name):
        for copy_args in stage.args("COPY"):
            if copy_args.startswith("--from="):
                continue
            for source in copy_args.split()[:-1]:
                assert (ROOT / source).exists(), f"{name}: COPY {source} does not exist"
                assert not dockerignore_excludes(source), f"{name}: .dockerignore leaves out {source}"


def test_dockerignore_keeps_local_state_out() -> None:
    for path in (".git", ".venv", ".tools/bin/helm", "tests/test_http_api.py", "docs/kubernetes.md",
                 "services/minedraft/__pycache__/x.pyc", "operator/minedraft_operator.egg-info"):
        assert dockerignore_excludes(path), path
    for path in ("pyproject.toml", "services/minedraft/bundled.py", "proto/minedraft/v1/generation.proto"):
        assert not dockerignore_excludes(path), path
