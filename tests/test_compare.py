"""Run comparison (cs336sys.runs.compare) on synthetic runs with known answers; CPU only."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cs336sys import studies as S
from cs336sys.runs import compare as cmp
from workflow_helpers import DEMO, DEMO_RUN, configfile_args, copy_repo, parse_dry_run, snakemake

ROOT = Path(__file__).resolve().parents[1]
CELL = "size=small_context_length=128_precision=bf16_impl={}_compile=False"
ENV_A = dict(
    device_name="NVIDIA H100 80GB HBM3",
    driver_version="550.54",
    torch_version="2.11.0+cu130",
    cuda_version="13.0",
    git_commit="aaaaaaa",
    host="node1",
)
ENV_B = dict(ENV_A, device_name="NVIDIA H200", git_commit="bbbbbbb")


def row(cell, mode, phase, median, rel, env, status="ok", noisy=False, study="e2e", **extra):
    """One tidy result row; ``rel`` is the half-width of the 95 % interval relative to the median."""
    ok = status == "ok"
    return {
        "study": study,
        "cell_id": CELL.format(cell),
        "status": status,
        "error": "" if ok else "CUDA out of memory",
        "mode": mode,
        "phase": phase,
        "median_ms": median if ok else None,
        "ci_low_ms": median * (1 - rel) if ok else None,
        "ci_high_ms": median * (1 + rel) if ok else None,
        "noisy": noisy,
        **extra,
        **env,
    }


def cells(env, factors, rel=0.01, **kw):
    """The rows of cells named by ``factors`` (cell → median factor relative to 10 ms), 2 modes × phases."""
    rows = []
    for cell, f in factors.items():
        rows += [
            row(cell, "inference", "forward", 10.0 * f, rel, env, **kw),
            row(cell, "train", "forward", 10.0 * f, rel, env, **kw),
            row(cell, "train", "backward", 20.0 * f, rel, env, **kw),
        ]
    return rows


def write_run(path: Path, rows, config=None, study="e2e") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path / f"{study}.csv", index=False)
    if config is not None:
        (path / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def one(table, cell, mode="inference", phase="forward"):
    sel = table[(table["cell_id"] == CELL.format(cell)) & (table["mode"] == mode) & (table["phase"] == phase)]
    assert len(sel) == 1, sel
    return sel.iloc[0]


@pytest.fixture
def runs(tmp_path):
    """a: baseline; b: 'slow' +10 %, 'fast' -10 %, 'steady' +1 % inside ±3 % noise, 'gone' only in a,
    'new' only in b, 'big' ok in a and out of memory in training in b (one row, no phase)."""
    a_rows = cells(ENV_A, {"slow": 1.0, "fast": 1.0, "gone": 1.0, "big": 1.0}) + cells(ENV_A, {"steady": 1.0}, rel=0.03)
    b_rows = cells(ENV_B, {"slow": 1.1, "fast": 0.9, "new": 1.0}) + cells(ENV_B, {"steady": 1.01}, rel=0.03, noisy=True)
    b_rows += [row("big", "inference", "forward", 10.0, 0.01, ENV_B), row("big", "train", None, 0, 0, ENV_B, status="oom")]
    # a profile study: only its timing rows are compared, the kernel rows are not
    prof_a = [
        row("p", "train", "step", 5.0, 0.01, ENV_A, study="profile", kind="timing"),
        row("p", "train", "step", 1.0, 0.5, ENV_A, study="profile", kind="kernel"),
    ]
    prof_b = [
        row("p", "train", "step", 5.0, 0.01, ENV_B, study="profile", kind="timing"),
        row("p", "train", "step", 9.0, 0.5, ENV_B, study="profile", kind="kernel"),
    ]
    a = write_run(tmp_path / "h100", a_rows, config={"e2e": {"batch_size": 4, "warmup": 5}, "out": "results"})
    b = write_run(tmp_path / "h200", b_rows, config={"e2e": {"batch_size": 8, "warmup": 5}, "out": "results"})
    write_run(a, prof_a, study="profile")
    write_run(b, prof_b, study="profile")
    return a, b


def test_load_run_ignores_hidden_and_non_study_csvs(runs):
    a, _ = runs
    pd.DataFrame({"x": [1]}).to_csv(a / "summary.csv", index=False)
    pd.DataFrame(cells(ENV_A, {"tmp": 1.0})).to_csv(a / ".e2e.csv.123.tmp.csv", index=False)
    frames = cmp.load_run(a)
    assert sorted(frames) == ["e2e", "profile"]
    assert len(frames["e2e"]) == 15


def test_slowdown_beyond_noise_is_slower_and_fails_gate(runs, tmp_path):
    a, b = (cmp.load_run(d)["e2e"] for d in runs)
    t = cmp.compare_study(a, b)
    r = one(t, "slow")
    assert r["verdict"] == "slower"
    assert r["ratio"] == pytest.approx(1.10)
    assert r["ratio_low"] == pytest.approx(11 * 0.99 / (10 * 1.01))
    assert r["ratio_high"] == pytest.approx(11 * 1.01 / (10 * 0.99))
    regs = cmp.regressions(t, 1.05)
    assert CELL.format("slow") in set(regs["cell_id"])
    assert len(regs[regs["cell_id"] == CELL.format("slow")]) == 3  # all three (mode, phase) rows
    assert cmp.regressions(t, 1.15)["verdict"].ne("slower").all()  # above the threshold only

    res = cmp.write_comparison(list(runs), ["h100", "h200"], tmp_path / "out", fail_above=1.05)
    assert not res.passed
    assert CELL.format("slow") in set(res.regressions["cell_id"])
    assert cmp.main([str(runs[0]), str(runs[1]), "--out", str(tmp_path / "cli"), "--fail-above", "1.05"]) == 1
    # no gate: it passes, the report still lists the slow cells
    assert cmp.write_comparison(list(runs), ["h100", "h200"], tmp_path / "nogate").passed


def test_change_inside_noise_is_same_and_gate_passes(tmp_path):
    a = write_run(tmp_path / "a", cells(ENV_A, {"steady": 1.0}, rel=0.03))
    b = write_run(tmp_path / "b", cells(ENV_A, {"steady": 1.01}, rel=0.03))
    t = cmp.compare_study(cmp.load_run(a)["e2e"], cmp.load_run(b)["e2e"])
    assert (t["verdict"] == "same").all() and len(t) == 3
    assert one(t, "steady")["ratio"] == pytest.approx(1.01)
    assert cmp.regressions(t, 1.05).empty and cmp.regressions(t, 1.0).empty
    assert cmp.main([str(a), str(b), "--out", str(tmp_path / "out"), "--fail-above", "1.05"]) == 0


def test_speedup_beyond_noise_is_faster(runs):
    a, b = (cmp.load_run(d)["e2e"] for d in runs)
    t = cmp.compare_study(a, b)
    r = one(t, "fast", "train", "backward")
    assert r["verdict"] == "faster" and r["ratio"] == pytest.approx(0.9)
    assert one(t, "steady")["verdict"] == "same"
    assert one(t, "steady")["flags"] == "noisy(b)"
    assert CELL.format("fast") not in set(cmp.regressions(t, 1.0)["cell_id"])


def test_cells_in_one_run_only(runs):
    a, b = (cmp.load_run(d)["e2e"] for d in runs)
    t = cmp.compare_study(a, b)
    gone, new = t[t["cell_id"] == CELL.format("gone")], t[t["cell_id"] == CELL.format("new")]
    assert len(gone) == 3 and (gone["only_in"] == "a").all() and (gone["verdict"] == "n/a").all()
    assert len(new) == 3 and (new["only_in"] == "b").all()
    assert (t.loc[~t["cell_id"].isin(gone["cell_id"].tolist() + new["cell_id"].tolist()), "only_in"] == "").all()


def test_ok_to_oom_is_a_status_change_and_a_regression(runs):
    a, b = (cmp.load_run(d)["e2e"] for d in runs)
    t = cmp.compare_study(a, b)
    big = t[t["cell_id"] == CELL.format("big")]
    # b's single oom row (mode=train, no phase) stands for both training phases of a
    train = big[big["mode"] == "train"]
    assert sorted(train["phase"]) == ["backward", "forward"]
    assert (train["status_change"] == "ok → oom").all() and (train["verdict"] == "n/a").all()
    assert (train["only_in"] == "").all()
    assert one(t, "big")["status_change"] == ""  # inference still ran
    regs = cmp.regressions(t, 1.05)
    assert len(regs[regs["cell_id"] == CELL.format("big")]) == 2


def test_old_run_without_intervals_gives_na(tmp_path):
    old = pd.DataFrame(cells(ENV_A, {"slow": 1.0})).drop(columns=["ci_low_ms", "ci_high_ms", "noisy"])
    a = tmp_path / "old"
    a.mkdir()
    old.to_csv(a / "e2e.csv", index=False)
    b = write_run(tmp_path / "new", cells(ENV_B, {"slow": 1.5}))
    t = cmp.compare_study(cmp.load_run(a)["e2e"], cmp.load_run(b)["e2e"])
    assert (t["verdict"] == "n/a").all()
    assert (t["note"] == "no interval recorded").all()
    assert one(t, "slow")["ratio"] == pytest.approx(1.5)  # the medians are still compared
    res = cmp.write_comparison([a, b], ["old", "new"], tmp_path / "out", fail_above=1.05)
    assert res.passed  # without intervals nothing is judged slower
    assert "no interval recorded" in res.report_path.read_text()


def test_environment_and_config_diff(runs):
    env = cmp.environment_diff(*(cmp.load_run(d) for d in runs)).set_index("field")
    assert env.loc["device_name", "differs"] and env.loc["git_commit", "differs"]
    assert env.loc["device_name", "a"] == ENV_A["device_name"] and env.loc["device_name", "b"] == "NVIDIA H200"
    assert env.loc["cuda_version", "a"] == "13.0"  # read as text, not as the float 13.0 → "13.0" by luck
    assert not env.loc["torch_version", "differs"] and not env.loc["host", "differs"]
    cfg = cmp.config_diff(*(yaml.safe_load((d / "config.yaml").read_text()) for d in runs))
    assert cfg.to_dict("records") == [{"key": "e2e.batch_size", "a": 4, "b": 8}]
    assert cmp.config_diff(None, {"a": 1}).empty


def test_report_csv_and_figures(runs, tmp_path):
    out = tmp_path / "report" / "h100-vs-h200"
    res = cmp.write_comparison(list(runs), ["h100", "h200"], out, fail_above=1.05)
    text = res.report_path.read_text()
    assert text.startswith("# `h100` vs `h200`")
    assert "## Study `e2e`" in text and "## Study `profile`" in text
    assert "slower" in text and "FAILED" in text
    assert "1.10 [1.08, 1.12]" in text  # ratio with its interval, 3 significant digits
    assert "`e2e.batch_size`: 4 → 8" in text
    assert "ok → oom" in text and "nan" not in text
    assert "NVIDIA H200" in text
    for study in ("e2e", "profile"):
        png = out / "figures" / f"{study}_ratio.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](figures/{study}_ratio.png)" in text
    table = pd.read_csv(out / "compare.csv", keep_default_na=False, na_values=[""])
    assert (table["verdict"] == "n/a").sum() == 8  # oom in b (2 rows), only in a (3), only in b (3)
    assert set(table["study"]) == {"e2e", "profile"}
    assert len(table[table["study"] == "profile"]) == 1  # kernel rows are not compared
    assert table.loc[table["study"] == "profile", "verdict"].item() == "same"
    assert not any(p.name.startswith(".") for p in out.rglob("*"))  # no temporary files left


def test_exactly_two_runs(runs, tmp_path):
    with pytest.raises(ValueError, match="exactly 2 runs"):
        cmp.write_comparison([*runs, runs[0]], ["a", "b", "c"], tmp_path / "out")


def test_gate_writes_its_file_only_when_it_passes(runs, tmp_path):
    failure = cmp.gate(list(runs), ["h100", "h200"], 1.05, tmp_path / "gate-1.05.txt")
    assert failure.startswith("FAILED: `h200` vs `h100` (baseline), fail above 1.05")
    assert CELL.format("slow") in failure and "ok → oom" in failure and CELL.format("fast") not in failure
    assert not (tmp_path / "gate-1.05.txt").exists()
    a = write_run(tmp_path / "a", cells(ENV_A, {"steady": 1.0}, rel=0.03))
    b = write_run(tmp_path / "b", cells(ENV_A, {"steady": 1.01}, rel=0.03))
    assert cmp.gate([a, b], ["a", "b"], 1.05, tmp_path / "ok.txt") is None
    assert (tmp_path / "ok.txt").read_text().startswith("passed: `b` vs `a` (baseline), fail above 1.05")


def old_and_new_runs(tmp_path: Path, factors: dict, old_name="old", new_name="new") -> tuple[Path, Path]:
    """An e2e run as it was written before the axes' renaming (columns ``ctx`` and ``attn``, cell ids
    with those names, no ``cuda_graphs``) and one written now; ``factors``: impl → new median / old."""
    old_rows, new_rows = [], []
    for impl, f in factors.items():
        axes = {"size": "small", "context_length": 128, "precision": "bf16", "impl": impl, "compile": 0}
        old_axes = {"size": "small", "ctx": 128, "precision": "bf16", "attn": impl, "compile": 0}
        old_id = f"size=small_ctx=128_precision=bf16_attn={impl}_compile=0"
        new_axes = {**axes, "cuda_graphs": 0}
        old_env = dict(ENV_A, git_commit="1234567", cuda_version="12.10")
        for mode, phase, ms in (("inference", "forward", 10.0), ("train", "forward", 10.0), ("train", "backward", 20.0)):
            old_rows.append({**row(impl, mode, phase, ms, 0.01, old_env), "cell_id": old_id, **old_axes})
            new_rows.append({**row(impl, mode, phase, ms * f, 0.01, ENV_B), "cell_id": S.cell_id("e2e", new_axes), **new_axes})
    return write_run(tmp_path / old_name, old_rows), write_run(tmp_path / new_name, new_rows)


def test_old_run_matches_new_run_through_upgrade(tmp_path):
    old, new = old_and_new_runs(tmp_path, {"sdpa": 1.1, "eager": 1.0})
    frames = cmp.load_run(old)
    assert {"context_length", "impl", "cuda_graphs"} <= set(frames["e2e"].columns)
    assert not {"ctx", "attn"} & set(frames["e2e"].columns)
    t = cmp.compare_study(frames["e2e"], cmp.load_run(new)["e2e"])
    assert len(t) == 6 and (t["only_in"] == "").all()  # every old row found its new row
    sdpa = S.cell_id("e2e", {"size": "small", "context_length": 128, "precision": "bf16", "impl": "sdpa", "compile": 0, "cuda_graphs": 0})
    assert set(t["cell_id"]) == {sdpa, sdpa.replace("impl=sdpa", "impl=eager")}
    assert (t.loc[t["cell_id"] == sdpa, "verdict"] == "slower").all()
    assert (t.loc[t["cell_id"] != sdpa, "verdict"] == "same").all()
    assert t["ratio"].notna().all()
    env = cmp.environment_diff(frames, cmp.load_run(new)).set_index("field")
    assert env.loc["git_commit", "a"] == "1234567" and env.loc["cuda_version", "a"] == "12.10"  # text, not numbers
    res = cmp.write_comparison([old, new], ["old", "new"], tmp_path / "out", fail_above=1.05)
    assert not res.passed and set(res.regressions["cell_id"]) == {sdpa}


@pytest.mark.slow  # a fresh interpreter
def test_import_does_not_import_torch():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    code = "import cs336sys.runs.compare, sys; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- the workflow's targets: report/compare/<a>-vs-<b>/report.md and .../gate-<threshold>.txt


def _rules_run(output: str) -> dict[str, int]:
    return parse_dry_run(output)[1]  # the "Job stats" table, printed by real runs as well


@pytest.mark.slow
def test_workflow_compare_and_gate_measure_nothing(tmp_path):
    root = copy_repo(tmp_path / "repo")
    write_run(root / "results" / "r1", cells(ENV_A, {"slow": 1.0, "steady": 1.0}), config={"e2e": {"batch_size": 4}})
    write_run(root / "results" / "r2", cells(ENV_B, {"slow": 1.1, "steady": 1.0}), config={"e2e": {"batch_size": 4}})
    demo = configfile_args(DEMO)  # the compare rules read results/ only: this config's studies do not matter

    res = snakemake(root, "report/compare/r1-vs-r2/report.md", *demo)
    assert res.returncode == 0, res.describe()
    assert _rules_run(res.output) == {"compare": 1}
    out = root / "report" / "compare" / "r1-vs-r2"
    assert (out / "report.md").read_text().startswith("# `r1` vs `r2`")
    assert (out / "figures" / "e2e_ratio.png").is_file() and (out / "compare.csv").is_file()
    page = (out / "report.html").read_text()
    assert "r1" in page and "data:image/png;base64," in page  # one page, the ratio figure inside

    # the default config is a GPU sweep, but a comparison measures nothing: no CUDA check, no GPU needed
    (out / "report.md").unlink()
    default = snakemake(root, "report/compare/r1-vs-r2/report.md")
    assert default.returncode == 0 and (out / "report.md").is_file(), default.describe()

    passing = snakemake(root, "report/compare/r1-vs-r2/gate-1.15.txt", *demo)
    assert passing.returncode == 0, passing.describe()
    assert _rules_run(passing.output) == {"compare_gate": 1}  # the report is up to date
    assert (out / "gate-1.15.txt").read_text().startswith("passed: `r2` vs `r1` (baseline), fail above 1.15")

    failing = snakemake(root, "report/compare/r1-vs-r2/gate-1.05.txt", *demo)
    assert failing.returncode != 0, failing.describe()
    assert "FAILED: `r2` vs `r1` (baseline), fail above 1.05: 3 regression(s)" in failing.output
    assert CELL.format("slow") in failing.output and CELL.format("steady") not in failing.output
    assert not (out / "gate-1.05.txt").exists()

    missing = snakemake(root, "report/compare/r1-vs-nope/report.md", *demo)
    assert missing.returncode != 0 and "run 'nope' has no merged study CSVs" in missing.output, missing.describe()
    assert not (root / "results" / DEMO_RUN).exists(), "a cell job ran"

    # a run named like this config's own: read as it is, its merge and cells are not scheduled
    write_run(root / "results" / DEMO_RUN, cells(ENV_A, {"slow": 1.0}))
    dry = snakemake(root, "-n", f"report/compare/{DEMO_RUN}-vs-r2/report.md", *demo)
    assert dry.returncode == 0 and _rules_run(dry.output) == {"compare": 1}, dry.describe()


def test_an_interval_reaching_zero_still_judges_from_below():
    # a host-bound cell's interval can reach 0 (two passes, t with 1 degree of freedom): the ratio
    # is then bounded below only, so b can still be found slower, never faster, and shows ∞
    from cs336sys.runs.compare import compare_study
    from cs336sys.runs.compare_plot import ratio_text

    a = pd.DataFrame([row("wide", "inference", "forward", 10.0, 1.0, ENV_A), row("slow", "inference", "forward", 10.0, 1.0, ENV_A)])
    b = pd.DataFrame([row("wide", "inference", "forward", 12.0, 0.5, ENV_B), row("slow", "inference", "forward", 30.0, 0.05, ENV_B)])
    t = compare_study(a, b).set_index("cell_id")
    assert t.loc[CELL.format("wide"), "verdict"] == "same"  # [6/20, ∞] holds 1
    assert t.loc[CELL.format("slow"), "verdict"] == "slower"  # [28.5/20, ∞]: beyond the noise
    assert ratio_text(t.loc[CELL.format("slow")]).endswith("∞]")


# --- many rows: a report and a figure a reader can read, in seconds (30,000 rows took 500 s labelling the figure)


def test_a_ratio_figure_of_many_rows_labels_the_lowest_and_highest_and_says_what_it_left_out():
    import numpy as np

    from cs336sys.runs.compare_plot import close, ratio_figure

    n = 5000
    ratio = np.linspace(0.5, 2.0, n)
    verdict = np.where(ratio > 1.2, "slower", np.where(ratio < 0.8, "faster", "same"))
    table = pd.DataFrame(
        {
            "cell_id": [f"c{i}" for i in range(n)],
            "mode": "inference",
            "phase": "forward",
            "ratio": ratio,
            "ratio_low": ratio * 0.99,
            "ratio_high": ratio * 1.01,
            "verdict": verdict,
        }
    )
    fig = ratio_figure(table, "e2e: b vs a")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 60
    assert labels[:2] == ["c0 · inference/forward", "c1 · inference/forward"] and labels[-1] == f"c{n - 1} · inference/forward"
    assert "60 of 5000 rows: the 30 lowest and 30 highest ratios" in ax.get_title()
    assert any("4940 rows between, ratio 0.509 to 1.99" in t.get_text() for t in ax.texts)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"same ({(verdict == 'same').sum()})" in legend  # counted though no "same" row is drawn
    close(fig)


def test_a_report_of_many_changed_rows_lists_a_readable_number_and_counts_the_rest(tmp_path):
    factors = {f"slow{i}": 1.5 for i in range(30)}
    a = write_run(tmp_path / "a", cells(ENV_A, dict.fromkeys(factors, 1.0)))
    b = write_run(tmp_path / "b", cells(ENV_A, factors))
    text = cmp.write_comparison([a, b], ["a", "b"], tmp_path / "out").report_path.read_text()
    slower = text.split("### Slower in b", 1)[1].split("###", 1)[0]
    assert slower.count("| size=small") == 50 and "… and 40 more, every row in compare.csv" in slower
    assert len(pd.read_csv(tmp_path / "out" / "compare.csv")) == 90
