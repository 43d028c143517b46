"""HTML pages for ``snakemake --report``: a run's report.md and answers.md as one page, figures
embedded, and each merged CSV as a table a browser shows.

Snakemake's HTML report shows an HTML result in the page itself (an iframe) but offers a .md or
.csv result only as a download, and its landing page shows the workflow description
(workflow/report/workflow.rst), which includes the report page: tables, findings and figures are
the first thing a reader sees.

The Markdown read here is what our reports write (runs.report, handout.answers, md_table):
ATX headings, paragraphs, pipe tables with tabulate's alignment row, fenced code, "- " lists,
and inline code, **bold**, *italic* or _italic_, [links](…) and ![images](…). The project has no
Markdown dependency; docutils, which Snakemake brings, reads only reStructuredText.
"""

from __future__ import annotations

import base64
import html
import mimetypes
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from cs336sys.fileio import write_text_atomic

WRAP_ABOVE = 100  # characters: a table column with a longer value wraps, the others stay on one line
MAX_TABLE_ROWS = 2000  # a table page shows at most this many rows of a CSV (the CSV itself has all)

# Scoped to .cs336sys-page, which also carries Tailwind's `not-prose`: the same look alone in a
# browser, in Snakemake's result iframe, and on its landing page (inside Tailwind "prose").
CSS = """
.cs336sys-page { font: 14px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1e293b; max-width: none; }
.cs336sys-page h1 { font-size: 1.6em; font-weight: 700; margin: 0.4em 0 0.6em; }
.cs336sys-page h2 { font-size: 1.3em; font-weight: 700; margin: 1.6em 0 0.5em; padding-bottom: 0.2em; border-bottom: 1px solid #cbd5e1; }
.cs336sys-page h3 { font-size: 1.1em; font-weight: 600; margin: 1.2em 0 0.4em; }
.cs336sys-page p, .cs336sys-page ul { margin: 0.5em 0; max-width: 120ch; }
.cs336sys-page ul { list-style: disc; padding-left: 1.5em; }
.cs336sys-page a { color: #0369a1; text-decoration: underline; }
.cs336sys-page code { font: 0.9em ui-monospace, Menlo, Consolas, monospace; background: #f1f5f9; padding: 0 0.2em; border-radius: 3px; }
.cs336sys-page pre { background: #f1f5f9; padding: 0.5em 0.8em; overflow-x: auto; border-radius: 4px; }
.cs336sys-page pre code { padding: 0; }
.cs336sys-page .table-wrap { overflow-x: auto; margin: 0.6em 0; }
.cs336sys-page .table-page .table-wrap { overflow: visible; }  /* the page scrolls: the header row stays in view */
.cs336sys-page table { border-collapse: collapse; font-size: 0.9em; }
.cs336sys-page th, .cs336sys-page td { border: 1px solid #cbd5e1; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
.cs336sys-page th { background: #e2e8f0; font-weight: 600; position: sticky; top: 0; }
.cs336sys-page tbody tr:nth-child(even) { background: #f8fafc; }
.cs336sys-page tr.failed { background: #fef2f2; }
.cs336sys-page .r { text-align: right; font-variant-numeric: tabular-nums; }
.cs336sys-page .nw { white-space: nowrap; }
.cs336sys-page .wrap { min-width: 24em; }
.cs336sys-page .c { text-align: center; }
.cs336sys-page nav { background: #f1f5f9; padding: 0.4em 0.8em; border-radius: 4px; }
.cs336sys-page .figure { display: block; overflow-x: auto; margin: 0.8em 0; }
.cs336sys-page .figure img { display: block; max-width: 100%; height: auto; cursor: zoom-in; }
.cs336sys-page .figure img.full { max-width: none; cursor: zoom-out; }
.cs336sys-page .missing { color: #b91c1c; }
/* Snakemake's landing page shows the description in a narrow column beside the workflow graph,
   centred: give it the whole width (the graph goes below) and let it scroll from the top left. */
.overflow-auto:has(.cs336sys-page) { align-items: flex-start; justify-content: flex-start; min-width: 0; }
.flex:has(> div > .prose .cs336sys-page) { flex-direction: column; min-width: 0; }
.flex:has(> div > .prose .cs336sys-page) > div { width: 100%; min-width: 0; }
.prose:has(.cs336sys-page) { max-width: none; }
"""


def page(title: str, body: str) -> str:
    """A standalone HTML document; ``body`` goes inside the scoped ``.cs336sys-page`` block."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f'<div class="cs336sys-page not-prose">\n{body}\n</div>\n</body>\n</html>\n'
    )


# --- Markdown ------------------------------------------------------------------------------------


def slug(text: str) -> str:
    """GitHub's heading anchor: ``Study `e2e``` → ``study-e2e`` (the links in our reports use these)."""
    text = re.sub(r"[^\w\- ]", "", text.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def data_uri(path: Path) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


_CODE = re.compile(r"`([^`]+)`")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])|(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_RULE_CELL = re.compile(r"^:?-+:?$")
_LIST_ITEM = re.compile(r"^\s*[-*+]\s+(.*)$")
_ALIGN = {(False, True): "r", (True, True): "c"}  # a rule cell's colons (left, right) → the column's class


class Renderer:
    """Markdown to HTML for one page; heading ids stay unique across every document it renders.

    ``link(href)`` rewrites a link target, ``image(src)`` returns ``(data URI or None, element id)``.
    """

    def __init__(self, link: Callable[[str], str] = str, image: Callable[[str], tuple[str | None, str]] | None = None):
        self.link, self.image = link, image
        self.ids: set[str] = set()
        self.headings: list[tuple[int, str, str]] = []  # (level, id, inner HTML), for a table of contents

    def unique_id(self, base: str) -> str:
        anchor, n = base or "section", 0
        while anchor in self.ids:
            n += 1
            anchor = f"{base}-{n}"
        self.ids.add(anchor)
        return anchor

    def inline(self, text: str) -> str:
        """Inline Markdown of one line or cell: code spans first (nothing inside them is markup)."""
        held: list[str] = []

        def hold(fragment: str) -> str:
            held.append(fragment)
            return f"\x00{len(held) - 1}\x00"

        text = _CODE.sub(lambda m: hold(f"<code>{html.escape(m.group(1))}</code>"), text)
        text = _IMAGE.sub(lambda m: hold(self.render_image(m.group(1), m.group(2))), text)
        text = _LINK.sub(lambda m: hold(f'<a href="{html.escape(self.link(m.group(2)))}">{_emphasis(m.group(1))}</a>'), text)
        text = _emphasis(text)
        while "\x00" in text:  # a held link's text may hold a code span
            text = re.sub(r"\x00(\d+)\x00", lambda m: held[int(m.group(1))], text)
        return text

    def render_image(self, alt: str, src: str) -> str:
        uri, anchor = self.image(src) if self.image else (src, "")
        if uri is None:
            return f'<span class="missing">figure missing: {html.escape(src)}</span>'
        ident = f' id="{html.escape(anchor)}"' if anchor else ""
        return (
            f'<span class="figure"{ident}><img src="{uri}" alt="{html.escape(alt)}" title="{html.escape(alt)}: click for full size"'
            " onclick=\"this.classList.toggle('full')\"></span>"
        )

    def table(self, lines: Sequence[str]) -> str:
        rows = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))] for line in lines]
        return html_table(rows[0], rows[2:], [_ALIGN.get((c[:1] == ":", c[-1:] == ":"), "") for c in rows[1]], self.inline)

    def render(self, text: str) -> str:
        out: list[str] = []
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if not line.strip():
                i += 1
            elif line.startswith("```"):
                lang, j = line[3:].strip(), i + 1
                while j < len(lines) and not lines[j].startswith("```"):
                    j += 1
                cls = f' class="language-{html.escape(lang)}"' if lang else ""
                out.append(f"<pre><code{cls}>{html.escape(chr(10).join(lines[i + 1 : j]))}</code></pre>")
                i = j + 1
            elif m := _HEADING.match(line):
                level, inner = len(m.group(1)), self.inline(m.group(2))
                anchor = self.unique_id(slug(m.group(2)))
                self.headings.append((level, anchor, inner))
                out.append(f'<h{level} id="{anchor}">{inner}</h{level}>')
                i += 1
            elif line.lstrip().startswith("|") and i + 1 < len(lines) and _is_rule_row(lines[i + 1]):
                j = i
                while j < len(lines) and lines[j].lstrip().startswith("|"):
                    j += 1
                out.append(self.table(lines[i:j]))
                i = j
            elif _LIST_ITEM.match(line):
                items = []
                while i < len(lines) and (m := _LIST_ITEM.match(lines[i])):
                    items.append(f"<li>{self.inline(m.group(1))}</li>")
                    i += 1
                out.append("<ul>" + "".join(items) + "</ul>")
            else:
                j = i
                while j < len(lines) and lines[j].strip() and not _starts_block(lines, j):
                    j += 1
                j = max(j, i + 1)
                out.append(f"<p>{self.inline(' '.join(s.strip() for s in lines[i:j]))}</p>")
                i = j
        return "\n".join(out)


def _emphasis(text: str) -> str:
    text = html.escape(text, quote=False).replace("\\|", "|")
    text = _BOLD.sub(r"<strong>\1</strong>", text)
    return _ITALIC.sub(lambda m: f"<em>{m.group(1) or m.group(2)}</em>", text)


def _is_rule_row(line: str) -> bool:
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    return bool(cells) and all(_RULE_CELL.match(c) for c in cells)


def _starts_block(lines: Sequence[str], j: int) -> bool:
    line = lines[j]
    table = line.lstrip().startswith("|") and j + 1 < len(lines) and _is_rule_row(lines[j + 1])
    return bool(line.startswith("```") or _HEADING.match(line) or _LIST_ITEM.match(line) or table)


def html_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    align: Sequence[str],
    cell: Callable[[str], str] = html.escape,
    row_classes: Sequence[str] | None = None,
) -> str:
    """A table in a horizontally scrolling box; ``align``: "r", "c" or "" per column.

    A column of short values keeps each on one line (the box scrolls instead); a column with
    a long one (error text) wraps at a readable width.
    """
    longest = [max((len(str(r[k])) for r in rows if k < len(r)), default=0) for k in range(len(header))]
    aligns = [*align, *[""] * len(header)]
    classes = [f"{a} nw".strip() if n <= WRAP_ABOVE else f"{a} wrap".strip() for a, n in zip(aligns, longest)]
    head = "".join(f'<th class="{c}">{cell(h)}</th>' for c, h in zip(classes, header))
    body = []
    for n, row in enumerate(rows):
        tr = f' class="{row_classes[n]}"' if row_classes and row_classes[n] else ""
        body.append(f"<tr{tr}>" + "".join(f'<td class="{c}">{cell(v)}</td>' for c, v in zip(classes, row)) + "</tr>")
    return f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


# --- the report page -------------------------------------------------------------------------------


def report_page(docs: Sequence[Path], title: str) -> str:
    """``docs`` (Markdown files of one directory) as one page, each in a section named by its file.

    A link to one of ``docs`` becomes a link inside the page (``answers.md`` → ``#answers.md``,
    ``report.md#study-e2e`` → ``#study-e2e``), a link to an embedded figure a link to the figure;
    images are embedded as data URIs, so the page needs no file beside it.
    """
    base = docs[0].parent
    names = {d.name for d in docs}
    texts = {d.name: d.read_text() for d in docs}
    embedded = {m.group(2) for text in texts.values() for m in _IMAGE.finditer(text) if (base / m.group(2)).is_file()}
    seen: set[str] = set()

    def link(href: str) -> str:
        path, _, fragment = href.partition("#")
        if path in names:
            return f"#{fragment or path}"
        return f"#{path}" if path in embedded and not fragment else href

    def image(src: str) -> tuple[str | None, str]:
        if src not in embedded:
            return None, ""
        anchor = "" if src in seen else src  # the first copy of a figure is the one links go to
        seen.add(src)
        return data_uri(base / src), anchor

    renderer = Renderer(link, image)
    renderer.ids |= names
    sections = [f'<section id="{html.escape(name)}">\n{renderer.render(text)}\n</section>' for name, text in texts.items()]
    contents = " · ".join(f'<a href="#{a}">{inner}</a>' for level, a, inner in renderer.headings if level == 2)
    nav = f"<nav><strong>Contents:</strong> {contents}</nav>"
    body = "\n".join(sections)
    return page(title, body.replace("</h1>", f"</h1>\n{nav}", 1) if "</h1>" in body else f"{nav}\n{body}")


def write_report_page(out: Path, docs: Sequence[Path], run: str) -> Path:
    return write_text_atomic(out, report_page(docs, f"cs336sys report — run {run}"))


# --- CSV tables ------------------------------------------------------------------------------------


def table_page(csv: Path, title: str, max_rows: int = MAX_TABLE_ROWS) -> str:
    """The CSV as written (no value reformatted), numbers right-aligned, failed rows tinted."""
    df = pd.read_csv(csv, dtype=str, keep_default_na=False)
    shown = df.head(max_rows)
    numeric = [bool(len(c[c != ""])) and pd.to_numeric(c[c != ""], errors="coerce").notna().all() for _, c in df.items()]
    failed = ["failed" if s not in ("", "ok") else "" for s in shown.get("status", pd.Series([""] * len(shown)))]
    intro = f"{len(df)} rows × {len(df.columns)} columns of <code>{html.escape(str(csv))}</code>"
    intro += f"; the first {max_rows} are shown here, the CSV has them all." if len(df) > max_rows else "."
    intro += " Rows whose status is not <code>ok</code> are tinted; an empty cell is —."
    rows = [[v if v != "" else "—" for v in row] for row in shown.itertuples(index=False)]
    table = html_table(list(df.columns), rows, ["r" if n else "" for n in numeric], row_classes=failed)
    return page(title, f'<div class="table-page">\n<h1>{html.escape(title)}</h1>\n<p>{intro}</p>\n{table}\n</div>')


def write_table_pages(outdir: Path, csvs: Mapping[str, Path], run: str) -> list[Path]:
    """``<outdir>/<study>.html`` for each study's merged CSV."""
    outdir.mkdir(parents=True, exist_ok=True)
    pages = {study: table_page(csv, f"Merged cells of study {study} — run {run}") for study, csv in csvs.items()}
    return [write_text_atomic(outdir / f"{study}.html", text) for study, text in pages.items()]
