"""report/<run>/answers.md from the committed reference runs and a synthetic one: every reference run's page
rebuilds from its CSVs with every handout question answered, numbers match the CSVs, absent studies read
"not measured", overlapping intervals read "no significant difference"."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from cs336sys.handout.answers import NOT_ANSWERED, SECTIONS, discover, main, write_answers
from cs336sys.handout.answers_common import Run
from cs336sys.pipeline.merge import load_study
from workflow_helpers import REPO, reference_runs

RESULTS = REPO / "results"
FIXTURE = REPO / "tests" / "fixtures" / "cpu-demo"  # a CPU demo cut small: every study the answers read, the fast lane's run
COMMITTED = reference_runs()  # every committed run with CSVs (docs/results.md lists them): the full suite
# runs whose studies are cut down to a cell or two below: the default sweep (every study) and the runs with OOM rows
REDUCED = ["h200", "h100-e2e", "h100-profile", "h100-memory", "h100-mha-performer"]
RUNS = ["fixture", *(pytest.param(run, marks=pytest.mark.slow) for run in COMMITTED)]


def _run_dir(run: str) -> Path:
    return FIXTURE if run == "fixture" else RESULTS / run


# Every benchmarking question of the handout (and the mha pages) the page must carry: (heading, question start).
QUESTIONS = [
    ("§1.1.3", "(a) How long do a forward and a backward pass take"),
    ("§1.1.3", "(b) With warm-up, how variable"),
    ("§1.1.3", "(c) What changes without warm-up"),
    ("§1.1.4", "(a) Does the profiler's forward time match"),
    ("§1.1.4", "(b) Which kernel takes the most forward time"),
    ("§1.1.4", "(c) Which non-matmul kernels"),
    ("§1.1.4", "(d) What share of time do matmuls take"),
    ("§1.1.4", "(e) Inside attention, how does softmax time compare"),
    ("§1.1.5", "(a) What do the accumulation loops give"),
    ("§1.1.5", "(b) Which dtype does each part of the model get under autocast"),
    ("§1.1.5", "(c) How much faster is a bf16 mixed-precision step"),
    ("§1.1.6", "(a) How does memory evolve over an inference forward vs a training step"),
    ("§1.1.6", "(b) What is the peak memory per context length"),
    ("§1.1.6", "(c) Does bf16 mixed precision change the peak"),
    ("§1.1.6", "(d) How large is one residual-stream activation"),
    ("§1.1.6", "(e) What are the largest allocations"),
    ("§1.2.1", "(a) How long do attention's forward and backward take"),
    ("§1.2.1", "(b) How much memory is held for the backward"),
    ("§1.2.1", "(c) Where does it run out of memory"),
    ("§1.2.1", "(d) How does memory scale with sequence length"),
    ("§1.3", "(torch.compile)"),
    ("§1.3", "(CUDA graphs)"),
    ("§1.3", "(FlashAttention-2)"),
    ("§1.3", "(leaderboard)"),
    ("mha", "(a) Do exact and Performer attention scale as expected"),
    ("mha", "(b) Where does each variant run out of memory"),
    ("mha", "(c) How do time and memory compare at the longest sequence"),
    ("mha", "(d) ReLU vs softmax"),
]


def _page(tmp_path: Path, run: str) -> str:
    out = write_answers(tmp_path / run / "answers.md", run, discover(_run_dir(run)))
    return out.read_text()


def _answers(page: str) -> dict[str, str]:
    """Question start → its answer (the rest of the paragraph after the bold question)."""
    found = {}
    for paragraph in page.split("\n\n"):
        m = re.match(r"\*\*(.+?)\*\* (.+)", paragraph, re.S)
        if m:
            found[m.group(1)] = m.group(2)
    return {
        start: next(a for q, a in found.items() if q.startswith(start)) for _, start in QUESTIONS if any(q.startswith(start) for q in found)
    }


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Each run's page, built the first time a test asks for it (the fast lane builds the fixture's only)."""
    tmp, built = tmp_path_factory.mktemp("answers"), {}

    def page(run: str) -> str:
        if run not in built:
            built[run] = _page(tmp, run)
        return built[run]

    return page


def test_the_reference_runs_are_found():
    assert {"h100", "h200", "h100-e2e", "h100-profile"} <= set(COMMITTED) and set(REDUCED) <= set(COMMITTED)


@pytest.mark.parametrize("run", RUNS)
def test_every_question_has_one_line_and_no_nan(pages, run):
    """Every reference run's answers page rebuilds from its committed CSVs, and links into its committed report."""
    page = pages(run)
    answers = _answers(page)
    assert set(answers) == {start for _, start in QUESTIONS}, sorted({s for _, s in QUESTIONS} - set(answers))
    for _, start in QUESTIONS:
        assert page.count(f"**{start}") == 1, start
        assert answers[start].strip(), start
    assert not re.search(r"\bnan\b", page, re.I), [line for line in page.splitlines() if re.search(r"\bnan\b", line, re.I)]
    assert NOT_ANSWERED not in page
    report = REPO / "report" / run  # the committed report and figures the links point to
    if run == "fixture" or not report.is_dir():
        return  # no report beside it: the fixture, or a run kept as timing CSVs only (docs/results.md)
    for figure in set(re.findall(r"\]\((figures/[^)]+\.png)\)", page)):
        assert (report / figure).is_file(), figure
    for study in set(re.findall(r"report\.md#study-(\w+)", page)):
        assert f"## Study `{study}`" in (report / "report.md").read_text(), study
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert len(headings) == len(SECTIONS)
    for heading, _ in QUESTIONS:  # each question sits under its handout section
        assert any(heading in h for h in headings), heading


def test_the_fixture_has_a_run_of_every_study_the_answers_read(pages):
    """A study that a handout question reads needs its run in the fixture, or the fast lane never answers the
    question: without it the page asks to enable the study. A study that no question reads needs none (a new
    study adds its fixture only if it wants its report tested in the fast lane; test_tables loads those there are)."""
    missing = sorted(set(re.findall(r"enable `([\w.+-]+)` \(`studies:`\)", pages("fixture"))))
    assert not missing, f"no fixture for {missing}: run tests/fixtures/make_demo_fixture.py on a CPU demo run"


@pytest.mark.slow
def test_h200_answers_from_its_data(pages):
    page = pages("h200")
    answers = _answers(page)
    e2e = load_study(RESULTS / "h200" / "e2e.csv", "e2e")
    # the default sweep at 2efb12e (sdpa, context 256, eager cells, two passes): fp32 / bf16 paired in one
    # process, and the GPU time of each from the same steps replayed as CUDA graphs
    eager = e2e[(e2e["impl"] == "sdpa") & (e2e["cuda_graphs"].astype(int) == 0) & (e2e["context_length"] == 256)]
    bf16 = answers["(c) How much faster is a bf16 mixed-precision step"]
    pair = eager[
        (eager["kind"] == "pair") & (eager["pair_with"] == "precision=bf16") & (eager["mode"] == "train") & (eager["phase"] == "step")
    ]
    small = pair[pair["size"] == "small"].iloc[0]
    # the paired ratio as measured, whether a finding ("0.867× [0.789, 0.952]: bf16 is slower", b68f816's run)
    # or not ("no significant difference (0.915× [0.815, 1.03]; …", this run's: the small model's step is host-bound)
    ratio = f"{small['ratio']:.3g}× [{small['ratio_ci_low']:.3g}, {small['ratio_ci_high']:.3g}]"
    assert re.search(rf"small at context 256: (no significant difference \()?{re.escape(ratio)}", bf16), bf16
    timed = eager[eager["kind"].isna() & (eager["mode"] == "train") & (eager["phase"] == "step") & (eager["size"] == "small")]
    gpu = timed.set_index("precision")["gpu_median_ms"]
    assert (
        f"GPU time (the same steps replayed as CUDA graphs; the two cells' intervals): small at context 256: {gpu['fp32'] / gpu['bf16']:.3g}× ["
        in bf16
    )
    assert "interval unbounded" not in bf16
    forward = eager[
        (eager["mode"] == "train") & (eager["phase"] == "forward") & (eager["precision"] == "fp32") & (eager["size"] == "large")
    ]
    forward = forward.iloc[0]
    low, high = forward["ci_low_ms"], forward["ci_high_ms"]
    assert (
        f"large: forward {forward['median_ms']:.4g} ms [{low:.4g}, {high:.4g}]"
        in answers["(a) How long do a forward and a backward pass take"]
    )
    assert "NVIDIA H200" in answers["(a) How long do a forward and a backward pass take"]
    assert "report.md#study-e2e" in answers["(a) How long do a forward and a backward pass take"]
    assert "figures/e2e/bf16_speedup.png" in answers["(c) How much faster is a bf16 mixed-precision step"]
    # studies of the run answer their questions; what the run did not measure says so
    scaling = "(a) Do exact and Performer attention scale as expected"  # the default measures mha at one length
    measured = [s for _, s in QUESTIONS if s not in ("(torch.compile)", "(CUDA graphs)", scaling)]
    assert not [s for s in measured if "not measured" in answers[s]]
    assert "enable `mha.grid.seq_len` with two or more lengths" in answers[scaling]
    assert "not measured in this run: enable `e2e.grid.compile" in answers["(torch.compile)"]
    assert "seq_len 32768" in answers["(c) Where does it run out of memory"]  # the eager softmax OOM cell
    assert "Leaderboard configuration (seq_len 16384, head_dim 64, bf16, 16 heads;" in answers["(leaderboard)"]  # no snapshot: found
    prof = load_study(RESULTS / "h200" / "profile.csv", "profile")
    assert prof["device_name"].iloc[0] in page


@pytest.mark.slow
def test_a_run_without_a_study_says_not_measured(tmp_path):
    csvs = {"e2e": RESULTS / "h100-e2e" / "e2e.csv", "profile": RESULTS / "h100-profile" / "profile.csv"}
    answers = _answers(write_answers(tmp_path / "answers.md", "e2e-and-profile", csvs).read_text())
    for heading, start in QUESTIONS:
        text = answers[start]
        from_e2e_or_profile = heading == "§1.1.4" or start.startswith(
            ("(a) How long do a forward", "(b) With warm-up", "(c) How much faster")
        )
        if from_e2e_or_profile:
            assert "not measured" not in text, start
        elif start in ("(torch.compile)", "(CUDA graphs)", "(FlashAttention-2)", "(leaderboard)") or heading != "§1.3":
            assert text.startswith("_not measured in this run: enable "), (start, text)
    assert "enable `warmup` (`studies:`)" in answers["(c) What changes without warm-up"]
    assert "the same kernel leads both in" in answers["(b) Which kernel takes the most forward time"]


@pytest.mark.slow
def test_profile_answers_skip_a_largest_cell_whose_training_step_ran_out_of_memory(pages):
    # h100-profile's largest cell (2.7B, context 1024) is an OOM training step with no kernels
    prof = load_study(RESULTS / "h100-profile" / "profile.csv", "profile")
    assert (prof[(prof["size"] == "2.7B") & (prof["context_length"] == 1024)]["status"] == "oom").any()
    top = _answers(pages("h100-profile"))["(b) Which kernel takes the most forward time"]
    assert "not measured" not in top
    assert "In the training forward of 2.7B (context 512, fp32)" in top
    assert "of the 19 profiled cells whose training step ran" in top  # 20 cells, one OOM


def _synthetic_e2e(path: Path) -> Path:
    """Two sizes, fp32 and bf16 training steps with intervals: small's overlap, large's do not."""
    times = {
        ("small", "fp32"): (10.0, 9.0, 12.0),
        ("small", "bf16"): (9.5, 8.5, 11.0),
        ("large", "fp32"): (20.0, 19.5, 20.5),
        ("large", "bf16"): (10.0, 9.8, 10.2),
    }
    rows = []
    for (size, precision), (median, low, high) in times.items():
        cell = f"size={size}_context_length=128_precision={precision}_impl=eager_compile=0_cuda_graphs=0"
        for phase, share in (("step", 1.0), ("forward", 0.3), ("backward", 0.6)):
            axes = dict(size=size, context_length=128, precision=precision, impl="eager", compile=0, cuda_graphs=0)
            timing = dict(median_ms=median * share, ci_low_ms=low * share, ci_high_ms=high * share, mean_ms=median * share, std_ms=0.1)
            flags = dict(
                n=30, trials=3, ci_rel=(high - low) / 2 / median, noisy=False, host_bound=False, batch_size=4, device_name="Test GPU"
            )
            rows.append(dict(study="e2e", cell_id=cell, status="ok", error="", **axes, mode="train", phase=phase, **timing, **flags))
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_overlapping_intervals_read_no_significant_difference(tmp_path):
    csv = _synthetic_e2e(tmp_path / "e2e.csv")
    out = write_answers(tmp_path / "answers.md", "synthetic", {"e2e": csv})
    answers = _answers(out.read_text())
    bf16 = answers["(c) How much faster is a bf16 mixed-precision step"]
    assert "small at context 128: no significant difference (1.05× [0.818, 1.41])" in bf16
    assert "large at context 128: 2× [1.91, 2.09]: bf16 is faster" in bf16
    assert "Test GPU" in bf16 and "(no interval recorded)" not in bf16
    assert "small: forward 3 ms [2.7, 3.6]" in answers["(a) How long do a forward and a backward pass take"]
    assert answers["(a) What do the accumulation loops give"].startswith("_not measured in this run: enable `precision`")
    assert not re.search(r"\bnan\b", out.read_text(), re.I)


def test_cli_discovers_the_merged_csvs(tmp_path):
    run = tmp_path / "results" / "synthetic"
    run.mkdir(parents=True)
    _synthetic_e2e(run / "e2e.csv")
    (run / "notes.csv").write_text("a\n1\n")  # not a study: ignored
    assert discover(run) == {"e2e": run / "e2e.csv"}
    out = tmp_path / "answers.md"
    assert main([str(run), "--out", str(out)]) == 0
    assert "— run `synthetic`" in out.read_text()


def test_a_study_whose_cells_all_failed_says_why():
    frame = pd.DataFrame([{"study": "memory", "cell_id": "x", "status": "skipped", "error": "needs CUDA\nmore"}])
    text = Run("r", {"memory": frame}).absent("memory", "`memory.grid.context_length`")
    assert text == "_not measured in this run: every `memory` cell ended skipped (needs CUDA)._"


@pytest.mark.parametrize("pick", ["first", "first-two", "last", "failed"])
@pytest.mark.parametrize("run", ["fixture", *(pytest.param(run, marks=pytest.mark.slow) for run in REDUCED)])
def test_reduced_grids_still_answer_every_question(tmp_path, run, pick):
    """Each study cut down to a cell or two (or to its failed cells): every question still gets a sentence or a
    "not measured" line, never an exception, a "nan" or a broken section."""
    csvs = {}
    for study, path in discover(_run_dir(run)).items():
        df = load_study(path, study)
        cells = list(dict.fromkeys(df["cell_id"]))
        failed = list(dict.fromkeys(df.loc[df["status"] != "ok", "cell_id"]))
        keep = {"first": cells[:1], "first-two": cells[:2], "last": cells[-1:], "failed": failed}[pick]
        csvs[study] = tmp_path / f"{study}.csv"
        df[df["cell_id"].isin(keep)].to_csv(csvs[study], index=False)
    page = write_answers(tmp_path / "answers.md", "reduced", csvs).read_text()
    assert NOT_ANSWERED not in page
    assert not re.search(r"\bnan\b", page, re.I), [line for line in page.splitlines() if re.search(r"\bnan\b", line, re.I)]
    assert set(_answers(page)) == {start for _, start in QUESTIONS}


def test_flash_answer_compares_ours_with_pytorch_not_with_the_tutorial_kernel():
    from cs336sys.handout.answers_flash import answers_13

    shape = dict(seq_len=1024, head_dim=64, precision="bf16", num_heads=1, phase="forward", status="ok", device_name="GPU")
    times = {"triton": 10.0, "tutorial": 8.0, "sdpa-flash": 12.0}  # ours beats PyTorch's; the tutorial beats ours
    rows = [dict(shape, cell_id=impl, impl=impl, median_ms=ms, ci_low_ms=ms * 0.99, ci_high_ms=ms * 1.01) for impl, ms in times.items()]
    table = dict(answers_13(Run("synthetic", {"flash": pd.DataFrame(rows)})))[
        "(FlashAttention-2) How does our Triton kernel compare with PyTorch's implementations?"
    ]
    assert "faster than the fastest PyTorch implementation in 1 of 1" in table
    assert "sdpa-flash: 1.2×" in table and "tutorial: " not in table
