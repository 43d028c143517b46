"""The correctness check's verdicts (measure.checkcache): kept per code and shape class, checked again after an edit,
never read from a folder or file that is not safely this account's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from cs336sys import catalog, plugins
from cs336sys.measure import CACHE_DIR_ENV
from cs336sys.measure.correctness import check_implementation, check_shape
from cs336sys.models.attention import resolve, softmax_attention
from cs336sys.rows import Wrong

FIXTURE = Path(__file__).resolve().parent / "fixtures/course_repo"
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _no_user_lines():
    yield
    plugins.activate({})


def _counting(fn):
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    return counted, calls


def test_a_verdict_is_kept_per_code_and_shape_class_and_an_edit_checks_again(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    repo = shutil.copytree(FIXTURE, tmp_path / "course_repo")
    plugins.activate(
        {"path": str(repo), "attention": {"kept": {"function": "cs336_systems.wrong_attention:attention", "form": "callable"}}}
    )
    fn, calls = _counting(softmax_attention)
    shape = check_shape(1, 16)
    check_implementation("kept", fn, shape, "fp32", True, CPU)
    assert calls and len(list((tmp_path / "cache/checks").glob("*.json"))) == 1
    calls.clear()
    check_implementation("kept", fn, shape, "fp32", True, CPU)  # the same code and class: the verdict is read
    assert not calls
    for other in ({"precision": "bf16"}, {"causal": False}, {"shape": check_shape(1, 32)}):  # another class: checked again
        args = {"shape": shape, "precision": "fp32", "causal": True, **other}
        check_implementation("kept", fn, args["shape"], args["precision"], args["causal"], CPU)
        assert calls
        calls.clear()
    kernel = repo / "cs336_systems/wrong_attention.py"
    kernel.write_text(kernel.read_text() + "\n# edited\n")
    check_implementation("kept", fn, shape, "fp32", True, CPU)
    assert calls  # the edited kernel's code is another key


def test_a_wrong_verdict_is_kept_with_its_message(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    fn, calls = _counting(resolve("eager", kind=catalog.CORE)[0])
    wrong = lambda q, k, v, is_causal=False: 2 * fn(q, k, v, is_causal)  # noqa: E731
    for _ in range(2):
        with pytest.raises(Wrong, match="wrong (output|dq) against"):
            check_implementation("sdpa", wrong, check_shape(1, 16), "fp32", False, CPU)
    assert len(calls) == 1  # the second verdict was read


@pytest.mark.parametrize("spoil", ["link", "foreign", "open", "garbage", "other key", "fifo", "file link", "huge"])
def test_a_verdict_folder_or_file_not_safely_ours_only_means_checking_again(tmp_path, monkeypatch, capfd, spoil):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    folder = tmp_path / "cache/checks"
    fn, calls = _counting(softmax_attention)
    check_implementation("eager", fn, check_shape(1, 16), "fp32", True, CPU)
    (verdict,) = folder.glob("*.json")
    if spoil == "link":  # a planted link to a folder of someone else's verdicts
        shutil.move(folder, tmp_path / "theirs")
        folder.symlink_to(tmp_path / "theirs")
    elif spoil == "foreign":  # made by another account first (this test runs as root, or is skipped)
        if os.geteuid() != 0:
            pytest.skip("chown needs root")
        os.chown(folder, 12345, 12345)
    elif spoil == "open":
        folder.chmod(0o777)
    elif spoil == "garbage":
        verdict.write_text("{not json")
    elif spoil == "fifo":  # opening it for reading would wait for a writer
        verdict.unlink()
        os.mkfifo(verdict)
    elif spoil == "file link":
        (tmp_path / "theirs.json").write_text(verdict.read_text())
        verdict.unlink()
        verdict.symlink_to(tmp_path / "theirs.json")
    elif spoil == "huge":
        verdict.write_text(verdict.read_text() + " " * (1 << 17))
    else:
        verdict.write_text(verdict.read_text().replace('"fp32"', '"bf16"'))
    calls.clear()
    check_implementation("eager", fn, check_shape(1, 16), "fp32", True, CPU)
    assert calls  # checked again
    if spoil in ("link", "foreign", "open"):
        assert "neither read nor written" in capfd.readouterr().err
