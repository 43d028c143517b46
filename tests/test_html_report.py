"""The HTML report (`snakemake --report report.html`): the run's report as its landing page, figures
embedded and fitted to the page, a caption per figure kind, merged CSVs as HTML tables.

The Markdown → HTML pieces are checked directly; then the CPU demo's report.html is opened in
headless Chromium (Debian's `chromium` package), with a probe script added to a copy of the file,
and the rendered page must show each study's headline table and figures. Without Chromium that
test is skipped, saying how to install it, except under CI (`CI=true`), where it must run.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cs336sys.runs.html import Renderer, report_page, slug, table_page
from workflow_helpers import DEMO, DEMO_RUN, load_config, snakemake

# a valid 1×1 PNG: Chromium decodes it, so an embedded figure has a natural width
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
VIEWPORT = (1400, 1000)


# --- Markdown, the report page and the table pages ----------------------------------------------


def test_markdown_of_our_reports_renders_tables_headings_code_and_inline_markup():
    text = """# Run `x`

**Bold** and *italic* and _(no rows)_, but snake_case_names and 2 < 3 stay text; `a <b>`.

| size   |   ms | note    |
|:-------|-----:|:--------|
| small  | 1.5  | fast*   |
| large  | 20   | `x|y`?  |

```yaml
grid: {size: [small, large]}
```

- one
- two
"""
    out = Renderer().render(text)
    assert '<h1 id="run-x">Run <code>x</code></h1>' in out
    assert "<strong>Bold</strong>" in out and "<em>italic</em>" in out and "<em>(no rows)</em>" in out
    assert "snake_case_names" in out and "2 &lt; 3" in out and "<code>a &lt;b&gt;</code>" in out
    assert '<th class="r nw">ms</th>' in out and '<td class="r nw">1.5</td>' in out and '<td class="nw">fast*</td>' in out
    assert out.count("<tr>") == 3  # header and two rows
    assert '<pre><code class="language-yaml">grid: {size: [small, large]}</code></pre>' in out
    assert "<ul><li>one</li><li>two</li></ul>" in out
    assert slug("Study `e2e`") == "study-e2e" and slug("§1.1.3 End-to-end benchmarking") == "113-end-to-end-benchmarking"


def test_report_page_embeds_figures_and_keeps_links_inside_the_page(tmp_path):
    (tmp_path / "figures" / "e2e").mkdir(parents=True)
    (tmp_path / "figures" / "e2e" / "mfu.png").write_bytes(PNG)
    (tmp_path / "report.md").write_text(
        "# Report\n\nAnswers: [answers.md](answers.md).\n\n## Study `e2e`\n\n![mfu](figures/e2e/mfu.png)\n\n![gone](figures/e2e/gone.png)\n"
    )
    (tmp_path / "answers.md").write_text("# Answers\n\nSee [report](report.md#study-e2e), [figure](figures/e2e/mfu.png).\n")
    out = report_page([tmp_path / "report.md", tmp_path / "answers.md"], "t")
    assert '<section id="report.md">' in out and '<section id="answers.md">' in out
    assert 'href="#answers.md"' in out and 'href="#study-e2e"' in out and 'href="#figures/e2e/mfu.png"' in out
    assert f'id="figures/e2e/mfu.png"><img src="data:image/png;base64,{base64.b64encode(PNG).decode()}"' in out
    assert "figure missing: figures/e2e/gone.png" in out
    assert '<a href="#study-e2e">Study <code>e2e</code></a>' in out  # the table of contents


def test_table_page_shows_the_csv_as_written_and_tints_failed_rows(tmp_path):
    csv = tmp_path / "e2e.csv"
    csv.write_text("study,cell_id,status,error,median_ms\ne2e,a,ok,,1.50\ne2e,b,oom,CUDA out of memory,\n")
    out = table_page(csv, "Merged cells")
    assert "2 rows × 5 columns" in out
    assert '<tr class="failed"><td class="nw">e2e</td><td class="nw">b</td><td class="nw">oom</td>' in out
    assert '<td class="r nw">1.50</td>' in out and '<td class="r nw">—</td>' in out
    assert "the first 1 are shown here" in table_page(csv, "Merged cells", max_rows=1)


# --- the CPU demo's report in a browser ---------------------------------------------------------

# Added to a copy of report.html: once Snakemake's app has rendered its landing page, record what
# each study's section shows (tables: header and body rows; images: decoded and displayed widths),
# the HTML results and the figures' captions, in <pre id="probe">.
PROBE = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const page = document.querySelector(".cs336sys-page");
  const out = {width: page ? page.getBoundingClientRect().width : 0, studies: {}, html: [], captions: {}};
  for (const h of document.querySelectorAll('.cs336sys-page h2[id^="study-"]')) {
    const section = {tables: [], images: []};
    for (let el = h.nextElementSibling; el && el.tagName !== "H2"; el = el.nextElementSibling) {
      for (const t of el.querySelectorAll("table")) {
        section.tables.push({header: [...t.tHead.rows[0].cells].map(c => c.textContent), rows: t.tBodies[0].rows.length});
      }
      for (const img of el.querySelectorAll("img")) {
        section.images.push({alt: img.alt, natural: img.naturalWidth, shown: img.getBoundingClientRect().width,
                             box: img.parentElement.getBoundingClientRect().width});
      }
    }
    out.studies[h.id.slice("study-".length)] = section;
  }
  for (const [path, r] of Object.entries(results)) {
    if (r.mime_type === "text/html") out.html.push(path);
    if (r.mime_type === "image/png") out.captions[path] = r.caption;
  }
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 2000));
</script>"""


def chromium() -> str:
    """The browser, or a skip saying how to get it; under CI (`CI=true`) a missing browser fails the test."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    message = "headless Chromium is needed to render the HTML report: apt-get install -y chromium (.ci/run installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; CI=true: this test must run here")
    pytest.skip(message)


def render(html: Path, tmp: Path) -> str:
    """The DOM of ``html`` with :data:`PROBE` added, after Snakemake's app has run (headless Chromium)."""
    page = tmp / f"probed-{html.name}"
    text = html.read_text()
    end = text.rindex("</body>")
    page.write_text(text[:end] + PROBE + text[end:])
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking"]
    flags += ["--disable-component-update", "--disable-sync", f"--user-data-dir={tmp / 'chromium-profile'}", "--virtual-time-budget=10000"]
    cmd = [chromium(), *flags, f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", "--dump-dom", page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc.stdout


def probe(dom: str) -> dict:
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, f"the probe did not run: Snakemake's page did not load\n{dom[-3000:]}"
    return json.loads(m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def markdown_tables(section: str) -> list[tuple[list[str], int]]:
    """(header cells, body rows) of each pipe table in a report.md section, read independently of the library."""
    tables, lines = [], section.splitlines()
    for i in range(len(lines) - 1):
        if lines[i].startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()):
            rows = 0
            while i + 2 + rows < len(lines) and lines[i + 2 + rows].startswith("|"):
                rows += 1
            header = [re.sub(r"`|\*\*", "", c).strip() for c in lines[i].strip().strip("|").split("|")]
            tables.append((header, rows))
    return tables


@pytest.fixture(scope="module")
def demo_root(request) -> Path:
    """The session's finished CPU demo (conftest.py): the checkout's own where it is up to date.
    Without a browser to open its report, the test skips before the demo is run for it."""
    chromium()
    finished_demo = request.getfixturevalue("finished_demo")
    run = finished_demo.result
    assert run is None or run.returncode == 0, f"the CPU demo failed:\n{run.describe()}"
    return finished_demo.root


def test_without_chromium_the_browser_test_skips_saying_how_to_install_it_except_under_ci(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium"):
        chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        chromium()


@pytest.mark.slow
def test_html_report_opens_on_each_studys_headline_table_and_figures(demo_root, tmp_path):
    report = tmp_path / "report.html"
    built = snakemake(demo_root, "--report", str(report), "--nolock", "--configfile", DEMO, timeout=600)
    assert built.returncode == 0, built.describe()
    seen = probe(render(report, tmp_path))
    # the landing page is the report, at the page's width (not Snakemake's narrow description column)
    assert seen["width"] > 0, "the landing page does not show the report page: is rule report_html's page a target of rule all?"
    assert seen["width"] > 0.6 * VIEWPORT[0], f"the report is squeezed into {seen['width']} px of {VIEWPORT[0]}"

    markdown = (demo_root / "report" / DEMO_RUN / "report.md").read_text()
    for study in load_config(demo_root, DEMO)["studies"]:
        shown = seen["studies"].get(study)
        assert shown is not None, f"no section for study {study} on the landing page"
        section = re.split(rf"^## Study `{study}`$", markdown, flags=re.M)[1].split("\n## ")[0]
        tables = markdown_tables(section)
        assert [(t["header"], t["rows"]) for t in shown["tables"]] == tables, f"{study}: the tables differ from report.md"
        if tables:  # the headline table: the per-cell table, or the first finding
            assert shown["tables"][0]["rows"] > 0, f"{study}: empty headline table"
        pngs = sorted(p.stem for p in (demo_root / "report" / DEMO_RUN / "figures" / study).glob("*.png"))
        assert pngs and sorted(i["alt"] for i in shown["images"]) == pngs, f"{study}: figures {shown['images']} vs {pngs}"
        for image in shown["images"]:
            assert image["natural"] > 0, f"{study}: figure {image['alt']} did not decode"
            # fitted to the page: full size when it fits, else the page's width
            assert abs(image["shown"] - min(image["natural"], image["box"])) <= 1, f"{study}: {image}"
        assert f"report/{DEMO_RUN}/tables/{study}.html" in seen["html"], f"{study}: no HTML table of its merged CSV"

    assert f"report/{DEMO_RUN}/report.html" in seen["html"]
    generic = [p for p, c in seen["captions"].items() if "Look at" not in c and "No cell of this study ran" not in c]
    assert not generic, f"figures without a caption of their kind (workflow/report/figures.rst): {generic}"
