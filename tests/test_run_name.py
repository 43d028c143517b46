"""The default run name (`run: auto`): the GPU's model from its NVML name, "cpu" without one."""

from __future__ import annotations

import copy
import re

import pytest

from cs336sys.pipeline import config as C
from workflow_helpers import REPO, load_config

SCHEMA = REPO / "src" / "cs336sys" / "pipeline" / "config.schema.yaml"  # package data, beside pipeline/config.py
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+-]*$")  # the schema's $defs.name

NAMES = {  # NVML names as nvidia-smi prints them
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H100 PCIe": "h100",
    "NVIDIA H200": "h200",
    "NVIDIA GH200 480GB": "gh200",
    "NVIDIA A100-SXM4-80GB": "a100",
    "NVIDIA A100 80GB PCIe": "a100",
    "NVIDIA A10G": "a10g",
    "NVIDIA L40S": "l40s",
    "NVIDIA B200": "b200",
    "Tesla V100-SXM2-16GB": "v100",
    "Tesla T4": "t4",
    "NVIDIA GeForce RTX 4090": "rtx4090",
    "NVIDIA GeForce RTX 4070 Ti SUPER": "rtx4070tisuper",
    "NVIDIA GeForce GTX 1080 Ti": "gtx1080ti",
    "Quadro RTX 8000": "rtx8000",
    "NVIDIA RTX A6000": "a6000",
    "NVIDIA RTX 6000 Ada Generation": "rtx6000ada",
    "NVIDIA TITAN V": "titan-v",
    "": "gpu",  # a GPU whose name could not be read
}


@pytest.mark.parametrize("gpu_name, run", NAMES.items())
def test_run_name_from_the_nvml_name(gpu_name, run):
    assert C.run_name_for(gpu_name) == run
    assert NAME_PATTERN.match(run), f"{run!r} is not a valid run name"


def test_no_gpu_is_cpu():
    assert C.run_name_for(None) == "cpu"


def test_odd_characters_never_reach_a_path():
    assert NAME_PATTERN.match(C.run_name_for("-NVIDIA Ω/H100 (test)")), "not a path component"
    assert len(C.run_name_for("NVIDIA " + "x" * 100)) <= 64


@pytest.fixture
def default_config():
    return copy.deepcopy(load_config(REPO, validated=False))  # each test validates it, with the GPU it pretends


@pytest.mark.parametrize("given", ["auto", None])
def test_auto_or_unset_takes_the_detected_gpu(default_config, monkeypatch, given):
    monkeypatch.setattr(C, "detected_gpu_name", lambda: "NVIDIA H200")
    if given is None:
        default_config.pop("run", None)  # config.yaml leaves it to its default
    else:
        default_config["run"] = given
    assert C.validate_config(default_config, SCHEMA)[0]["run"] == "h200"


def test_no_gpu_names_the_run_cpu(default_config, monkeypatch):
    monkeypatch.setattr(C, "detected_gpu_name", lambda: None)
    default_config["run"] = "auto"
    assert C.validate_config(default_config, SCHEMA)[0]["run"] == "cpu"


def test_device_cpu_is_cpu_whatever_the_gpu(default_config, monkeypatch):
    monkeypatch.setattr(C, "detected_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    default_config.update(run="auto", device="cpu", studies=["precision"])
    assert C.validate_config(default_config, SCHEMA)[0]["run"] == "cpu"


def test_a_set_name_is_kept(default_config, monkeypatch):
    monkeypatch.setattr(C, "detected_gpu_name", lambda: pytest.fail("a set run name must not look for a GPU"))
    default_config["run"] = "h100-e2e-a"
    assert C.validate_config(default_config, SCHEMA)[0]["run"] == "h100-e2e-a"


def test_auto_with_cells_elsewhere_asks_for_a_name(default_config, monkeypatch):
    monkeypatch.setattr(C, "detected_gpu_name", lambda: None)
    default_config.update(run="auto", check_local_cuda=False)  # the SLURM profile, on a login node
    with pytest.raises(C.ConfigError, match=r"'run'.*--config run=h100"):
        C.validate_config(default_config, SCHEMA)


@pytest.mark.slow
def test_fake_gpus_need_no_nvml(monkeypatch):
    monkeypatch.setenv("CS336SYS_FAKE_GPUS", "fake-0")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi either
    assert C.run_name_for(C.detected_gpu_name()) == "gpu"
