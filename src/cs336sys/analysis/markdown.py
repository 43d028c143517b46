"""Markdown tables for people: the one formatter the report, the answers and the CLI share."""

from __future__ import annotations

import pandas as pd


def md_table(df: pd.DataFrame | None, floatfmt: str = ".4g") -> str:
    if df is None or df.empty:
        return "_(no rows)_"
    return df.to_markdown(index=False, floatfmt=floatfmt)
