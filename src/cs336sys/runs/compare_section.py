"""One study's section of a comparison's report.md: its verdict counts, the rows slower, faster and
host-dependent, why rows were not judged, energy per step, cells in one run only and status changes."""

from __future__ import annotations

import pandas as pd

from cs336sys.runs import compare_machines
from cs336sys.runs.compare_machines import HOST_DEPENDENT
from cs336sys.runs.compare_plot import cells_md, listed, md

VERDICTS = ("faster", "slower", HOST_DEPENDENT, "same", "n/a")


def study_section(study: str, t: pd.DataFrame, figure: str | None) -> list[str]:
    """The markdown lines of ``study``'s section from its rows ``t`` of compare.csv, with its ratio figure's path."""
    lines = [f"## Study `{study}`", ""]
    if t.empty:
        return lines + ["No timing rows in either run: nothing to compare.", ""]
    both = t[t["only_in"] == ""]
    counts = {v: int((both["verdict"] == v).sum()) for v in VERDICTS}
    counts |= {
        "only in a": int((t["only_in"] == "a").sum()),
        "only in b": int((t["only_in"] == "b").sum()),
        "status changes": int((t["status_change"] != "").sum()),
    }
    lines += [md(pd.DataFrame([counts])), ""]
    for verdict, title in (
        ("slower", "Slower in b (intervals do not overlap; ratio > 1)"),
        ("faster", "Faster in b (intervals do not overlap; ratio < 1)"),
    ):
        rows = both[both["verdict"] == verdict].sort_values("ratio", ascending=verdict == "faster")
        lines += [f"### {title}", "", listed(rows, lambda r: cells_md(r, ["flags"])) if len(rows) else "None.", ""]
    hosted = both[both["verdict"] == HOST_DEPENDENT].sort_values("ratio")
    if len(hosted):
        lines += [
            "### Host-dependent (host-bound on two machines: moved with the host, not judged)",
            "",
            listed(hosted, lambda r: cells_md(r, ["note"])),
            "",
        ]
    na = both[both["verdict"] == "n/a"]
    if len(na):
        reasons = na["note"].value_counts()
        lines += ["### Not judged (n/a)", ""] + [f"- {n} × {why}" for why, n in reasons.items()] + [""]
    joules = compare_machines.energy_table(both)
    if len(joules):
        lines += ["### Energy per step (b / a)", "", compare_machines.ENERGY_TEXT, "", listed(joules, md), ""]
    one = t[t["only_in"] != ""]
    lines += [
        "### Cells in one run only",
        "",
        listed(one[["cell_id", "mode", "phase", "only_in", "status_a", "status_b"]], md) if len(one) else "None.",
        "",
    ]
    changed = t[t["status_change"] != ""]
    lines += ["### Status changes", "", listed(changed[["cell_id", "mode", "phase", "status_change"]], md) if len(changed) else "None.", ""]
    if figure:
        lines += [f"![{study}: ratio b/a per cell]({figure})", ""]
    return lines
