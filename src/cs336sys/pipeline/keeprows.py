"""A cell's ``ok`` rows are replaced by rows that measured nothing only where the user asks.

A cell runs again when its settings or code change, when its CSV is lost, or under a run
name that another device path measured before: a GPU that is gone (``check_local_cuda:
false`` on a host without one) makes every cell ``skipped``, and its rows would have
replaced the run's ``ok`` rows with exit status 0. So a job whose new rows hold fewer
``ok`` rows than the cell's earlier CSV, and some that measured nothing (``skipped``,
``error``, ``timeout``: a GPU gone, a crash, a hang), writes nothing and fails
(``RowsKept``), naming the file and how to go on; ``oom`` and ``wrong`` rows are
measurements of today's code and replace the earlier rows as any rows do. The run's
merged CSV and report keep the earlier rows (their jobs wait for the failed one), and the
next run tries the cell again. ``overwrite: true`` (``--config overwrite=true``, a job
resource: it reruns nothing) replaces them.

Snakemake removes a job's output before the job runs, so every CSV a job writes is also
linked as ``<cell>.csv.last``, and the next job of the cell compares with that where its
output is gone. No torch, no pandas here.
"""

from __future__ import annotations

import contextlib
import csv
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

NO_MEASUREMENT = ("skipped", "error", "timeout")
SUFFIX = ".last"


class RowsKept(RuntimeError):
    """A cell job's rows would have replaced ``ok`` rows by rows that measured nothing; nothing was written."""


def last_path(output: str | os.PathLike) -> Path:
    """Where the last CSV written for the cell CSV ``output`` is kept: beside it, with :data:`SUFFIX` appended."""
    return Path(f"{output}{SUFFIX}")


def statuses(path: str | os.PathLike) -> Counter:
    """How many rows of each status a cell CSV holds; empty where it is missing, unreadable or has no ``status``."""
    try:
        with open(path, newline="") as f:
            return Counter(row.get("status") for row in csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return Counter()


def check_replacement(output: str | os.PathLike, rows: Iterable[Mapping[str, Any]], replace: bool = False) -> None:
    """RowsKept where ``rows`` would replace the cell's earlier ``ok`` rows by fewer and some that measured nothing."""
    if replace:
        return
    earlier = Path(output) if Path(output).is_file() else last_path(output)
    before = statuses(earlier)
    rows = list(rows)
    after = Counter(str(r.get("status")) for r in rows)
    nothing = {s: after[s] for s in NO_MEASUREMENT if after[s]}
    if not before["ok"] or after["ok"] >= before["ok"] or not nothing:
        return
    new = ", ".join(f"{n} {s}" for s, n in after.items())
    why = next((str(r.get("error")) for r in rows if str(r.get("status")) in nothing and r.get("error")), "")
    where = "" if earlier == Path(output) else f" (kept in {earlier})"
    raise RowsKept(
        f"kept the {before['ok']} ok rows of {output}{where}: this job's rows ({new}{': ' + why[:300] if why else ''}) "
        "measured less and would have replaced them. Nothing was written, and this job fails so that the run does not "
        "end as if it had measured; the run's merged CSV and report keep the earlier rows. Fix the cause and run again "
        "(a GPU gone? check_local_cuda, CUDA_VISIBLE_DEVICES), or measure under another run name (--config run=<name>), "
        "or replace the rows on purpose: --config overwrite=true"
    )


@contextlib.contextmanager
def replacing(output: str | os.PathLike, rows: Iterable[Mapping[str, Any]], replace: bool = False) -> Iterator[None]:
    """Around the write of a cell's CSV: :func:`check_replacement` before it, :func:`remember` after it."""
    check_replacement(output, rows, replace)
    yield
    remember(output)


def remember(output: str | os.PathLike) -> None:
    """Keep the CSV just written at ``output`` as the cell's last (a hard link, else a copy); never fails the job."""
    last, tmp = last_path(output), Path(output).with_name(f".tmp-{os.getpid()}-{Path(output).name}{SUFFIX}")
    try:
        tmp.unlink(missing_ok=True)
        try:
            os.link(output, tmp)
        except OSError:  # a file system without hard links
            tmp.write_bytes(Path(output).read_bytes())
        os.replace(tmp, last)
    except OSError as exc:
        print(f"{last} not kept: {exc}")
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
