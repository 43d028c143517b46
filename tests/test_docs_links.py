"""README.md and docs/: every relative link resolves, the committed runs are the reference runs that
docs/results.md lists, a sample of the numbers they quote comes out of the committed CSVs they cite,
and the config snippets they show are valid configs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cs336sys.pipeline.config import ConfigError, validate_config
from workflow_helpers import REPO, deep_update

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RESULTS_PAGE = REPO / "docs" / "results.md"

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """``text`` without code blocks and inline code: a link there is an example, not a link."""
    return _CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", _FENCE.sub("", path.read_text()), re.M)}


def links(path: Path) -> list[str]:
    return [m.group(1) for m in _LINK.finditer(_prose(path.read_text()))]


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {_rel(dest)})")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    assert links(doc) or doc.name != "README.md", "the README links nothing?"
    assert not broken_links(doc), f"{doc.relative_to(REPO)}: broken links {broken_links(doc)}"


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# A heading: with `code`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-heading-with-code) [gone](missing.md) [bad anchor](other.md#nope) "
        "`[in code](nowhere.md)` [web](https://example.org/x)\n"
    )
    assert broken_links(page) == ["missing.md (no such file)", f"other.md#nope (no heading #nope in {_rel(tmp_path / 'other.md')})"]


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:  # outside the checkout: the message names it as it can
        return str(path)


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move detail to docs/"
    assert "docs/results.md" in (REPO / "README.md").read_text()


# --- the reference runs ------------------------------------------------------------------------


def listed_runs() -> set[str]:
    """The run (or report) names in the first column of docs/results.md's tables of reference runs."""
    text = RESULTS_PAGE.read_text()
    section = text.split("## The reference runs", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, re.M))


def committed_runs() -> set[str]:
    out = subprocess.run(["git", "ls-files", "results", "report"], cwd=REPO, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        pytest.skip(f"not a git checkout: {out.stderr.strip()}")
    runs = set()
    for path in out.stdout.split():
        parts = path.split("/")
        runs.add("/".join(parts[1:3]) if parts[1] == "compare" else parts[1])
    return runs


@pytest.mark.slow
def test_the_committed_runs_are_the_reference_runs_of_docs_results_md():
    committed, listed = committed_runs(), listed_runs()
    assert committed == listed, (
        f"committed but not in docs/results.md: {sorted(committed - listed)}; listed but not committed: {sorted(listed - committed)}"
    )


@pytest.mark.slow
def test_git_ignores_any_other_run_and_keeps_the_reference_runs():
    others = ["results/my-run/e2e.csv", "report/my-run/report.md", "report/compare/a-vs-b/report.md"]
    reference = [f"results/{r}/config.yaml" if (REPO / "results" / r).is_dir() else f"report/{r}/report.md" for r in sorted(listed_runs())]
    out = subprocess.run(["git", "check-ignore", "--no-index", *others, *reference], cwd=REPO, capture_output=True, text=True, timeout=60)
    if out.returncode == 128:
        pytest.skip(f"not a git checkout: {out.stderr.strip()}")
    ignored = set(out.stdout.split())
    assert ignored == set(others), f"not ignored: {sorted(set(others) - ignored)}; reference runs ignored: {sorted(ignored - set(others))}"


# --- numbers quoted from the committed runs ----------------------------------------------------


def _read(path: str) -> pd.DataFrame:
    return pd.read_csv(REPO / path)


def ms(row: pd.Series) -> str:
    """``median [low, high]`` as the docs print it: four significant digits, trailing zeros kept."""
    return f"{row['median_ms']:#.4g} [{row['ci_low_ms']:#.4g}, {row['ci_high_ms']:#.4g}]"


def ratio(row: pd.Series) -> str:
    return f"{row['ratio']:#.3g} [{row['ratio_low']:#.3g}, {row['ratio_high']:#.3g}]"


def _one(df: pd.DataFrame, **where) -> pd.Series:
    for col, value in where.items():
        df = df[df[col] == value]
    assert len(df) == 1, f"{where}: {len(df)} rows"
    return df.iloc[0]


def _best() -> list[str]:
    e2e = _read("results/h100-e2e-best/e2e.csv")
    small = _one(e2e, size="small", impl="sdpa", compile=1, mode="train", phase="step")
    biggest = _one(e2e, size="2.7B", impl="sdpa", compile=1, mode="train", phase="step")
    return [ms(small), ms(biggest), f"{biggest['mfu_pct']:.3g}%"]


def _flash() -> list[str]:
    flash = _read("results/h100-flash/flash.csv")
    board = dict(seq_len=16384, head_dim=64, num_heads=16, precision="bf16")
    ours = [ms(_one(flash, **board, impl="triton", phase=p)) for p in ("forward", "backward", "forward_backward")]
    cudnn = ms(_one(flash, **board, impl="sdpa-cudnn", phase="forward"))
    long = _one(flash, seq_len=65536, head_dim=128, impl="triton", phase="forward")
    return [" / ".join(ours), cudnn, ms(long), f"{long['mfu_pct']:.3g}%"]


def _compare() -> list[str]:
    cmp = _read("report/compare/h200-vs-h100/compare.csv")
    softmax_cell = "d_model=64_seq_len=16384_activation=softmax_impl=eager_causal=1_precision=fp32"
    softmax = _one(cmp, study="attention", cell_id=softmax_cell, mode="train", phase="step")
    graphs_cell = "size=large_context_length=256_precision=bf16_impl=sdpa_compile=0_cuda_graphs=1"
    graphs = _one(cmp, study="e2e", cell_id=graphs_cell, mode="train", phase="step")
    mha = cmp[(cmp["study"] == "mha") & (cmp["verdict"] == "slower")]
    flash = cmp[cmp["study"] == "flash"]
    return [
        f"{softmax['median_b_ms']:.1f} vs {softmax['median_a_ms']:.1f} ms, ratio {ratio(softmax)}",
        f"{len(mha)} of {len(cmp[cmp['study'] == 'mha'])} mha rows {mha['ratio'].min():.2f}–{mha['ratio'].max():.2f}×",
        ratio(graphs),
        f"{(flash['verdict'] == 'same').sum()} of {len(flash)} flash rows `same`",
    ]


def _repeatability() -> list[str]:
    pairs = _read("report/h100-repeatability-passes/pairs.csv")
    gpu, host = pairs[~pairs["host_bound"]], pairs[pairs["host_bound"]]
    return [
        f"of {len(pairs)} rows",
        f"{pairs['b_inside_a'].mean():.0%} of the second run's medians",
        f"the {len(gpu)} rows\nthat were not host-bound moved by a median {gpu['rel_diff'].abs().median():.2%} (at most {gpu['rel_diff'].abs().max():.2%})",
        f"the {len(host)} host-bound ones by a\nmedian {host['rel_diff'].abs().median():.1%}",
    ]


def _gpu_time_and_pairs() -> list[str]:
    e2e = _read("results/h100-b4f53bf/e2e.csv")
    timed, pairs = e2e[e2e["kind"].isna()], e2e[e2e["kind"] == "pair"]
    gpu = (timed["gpu_ci_high_ms"] - timed["gpu_ci_low_ms"]) / 2 / timed["gpu_median_ms"]
    width = (pairs["ratio_ci_high"] - pairs["ratio_ci_low"]) / 2 / pairs["ratio"]
    return [
        f"the {len(gpu)}\nGPU-time phase rows are within ±{gpu.max():.1%} of their median",
        f"Of the {len(pairs)} paired ratios (fp32 / bf16, eager / graph), {(width <= 0.15).sum()} are within ±15%",
        f"(±{width.max():.1%} at most)",
    ]


def _repeatability_h100() -> list[str]:
    m = _read("report/h100-repeatability-b4f53bf/measures.csv")
    inside = m.groupby(["study", "measure"])["b_inside_a"].agg(["mean", "size"])
    e2e = inside.loc["e2e"]
    return [
        f"{e2e.loc['eager', 'mean']:.0%} of the {e2e.loc['eager', 'size']} eager e2e rows, "
        f"{e2e.loc['GPU time', 'mean']:.0%} of the {e2e.loc['GPU time', 'size']}\nGPU-time rows and "
        f"{e2e.loc['paired ratio', 'mean']:.1%} of the {e2e.loc['paired ratio', 'size']} paired ratios",
        f"(attention {inside.loc[('attention', 'eager'), 'mean']:.1%}, mha {inside.loc[('mha', 'eager'), 'mean']:.1%}",
    ]


def _overhead() -> list[str]:
    jobs = _read("report/h100-overhead/jobs.csv")
    cold, warm = jobs[~jobs["warm_worker"]], jobs[jobs["warm_worker"]]
    warm = warm.drop(warm["job_start_up_s"].idxmax())  # the job that started the worker
    return [f"{cold['job_start_up_s'].median():.2f} s to {warm['job_start_up_s'].median():.2f} s"]


QUOTED = {  # the reference run or report → the text docs/results.md quotes from its committed files
    "h100-e2e-best": _best,
    "h100-flash": _flash,
    "compare/h200-vs-h100": _compare,
    "h100-repeatability-passes": _repeatability,
    "h100-overhead": _overhead,
    "h100-b4f53bf": _gpu_time_and_pairs,
    "h100-repeatability-b4f53bf": _repeatability_h100,
}


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("source", sorted(QUOTED))
def test_quoted_numbers_come_from_the_committed_files(source):
    text = _normalised(RESULTS_PAGE.read_text())
    for quoted in QUOTED[source]():
        assert _normalised(quoted) in text, f"docs/results.md should quote {quoted!r} from {source}"


def test_the_readme_quotes_the_2_7b_step_and_the_flash_forward_from_their_runs():
    text = _normalised((REPO / "README.md").read_text())
    _, step, mfu = _best()
    assert f"{step} ms, {mfu} MFU" in text
    assert f"takes {_flash()[0].split(' / ')[0]} ms" in text


# --- config snippets -----------------------------------------------------------------------------

_INLINE_CONFIG = re.compile(r"`((?:[a-z_0-9]+): \{[^`]*\})`")


def config_snippets(path: Path) -> list[str]:
    """The ```yaml blocks of a page and its inline flow mappings (`e2e: {resources: {…}}`) that set config keys;
    templates with placeholders (`<name>`, `...`) are not configs."""
    text = path.read_text()
    snippets = re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S) + _INLINE_CONFIG.findall(text)
    snippets = [re.sub(r",\s*(…|\.\.\.)\s*(?=[}\]])", "", s) for s in snippets]  # `{a: 1, …}`: "and so on"
    return [s for s in snippets if not re.search(r"<\w+>|\.\.\.|…", s)]


def _check(snippet: str) -> None:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    deep_update(config, yaml.safe_load(snippet))
    config.setdefault("run", "auto")
    if config["run"] == "auto":
        config["run"] = "docs"  # not this machine's GPU: a snippet is checked the same on any machine
    validate_config(config)


@pytest.mark.parametrize("doc", [d for d in DOCS if config_snippets(d)], ids=lambda p: str(p.relative_to(REPO)))
def test_config_snippets_in_the_docs_are_valid_configs(doc):
    for snippet in config_snippets(doc):
        try:
            _check(snippet)
        except ConfigError as exc:
            pytest.fail(f"{doc.relative_to(REPO)}: the snippet {snippet.strip()!r} is not a valid config: {exc}")


def test_a_misplaced_resources_key_is_caught():
    with pytest.raises(ConfigError):
        _check("resources: {e2e: {runtime_min: 30, mem_mb: 16000}}")
    _check("e2e: {resources: {runtime_min: 30, mem_mb: 16000}}")
