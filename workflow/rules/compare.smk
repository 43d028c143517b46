# Compare two finished runs cell by cell (cs336sys.runs.compare): a report, and a gate for CI.
#   snakemake report/compare/<a>-vs-<b>/report.md       baseline a, candidate b (results/<a>/, results/<b>/);
#                                                        also report.html (one page, figures inside), compare.csv
#   snakemake report/compare/<a>-vs-<b>/gate-1.05.txt   fails when a cell of b is slower beyond noise
#                                                        by more than 5 %, is no longer ok or missing, has no
#                                                        median or interval, or ran with other settings
#                                                        (cs336sys.runs.gate); a CSV that breaks the row
#                                                        contract is refused, named (both rules)
# These rules read results/<run>/ only: they measure nothing and need none of this config's studies.
localrules:
    compare,
    compare_gate,


rule compare:
    input:
        unpack(run_files),
    output:
        md=report(
            f"{compare_dir()}/report.md",
            caption="../report/compare.rst",
            category="Compare",
            subcategory="{a} vs {b}",
            labels={"comparison": "{a} vs {b}", "file": "report.md"},
        ),
        html=report(
            f"{compare_dir()}/report.html",
            caption="../report/compare.rst",
            category="Compare",
            subcategory="{a} vs {b}",
            labels={"comparison": "{a} vs {b}", "file": "report.html"},
        ),
        csv=report(
            f"{compare_dir()}/compare.csv",
            caption="../report/compare.rst",
            category="Compare",
            subcategory="{a} vs {b}",
            labels={"comparison": "{a} vs {b}", "file": "compare.csv"},
        ),
        figures=report(
            directory(f"{compare_dir()}/figures"),
            patterns=["{name}.png"],
            caption="../report/compare.rst",
            category="Compare",
            subcategory="{a} vs {b}",
            labels={"comparison": "{a} vs {b}", "file": "{name}.png"},
        ),
    log:
        f"{compare_dir('logs')}/report.log",
    wildcard_constraints:
        a=RUN_NAME,
        b=RUN_NAME,
    params:
        runs=lambda wc: [f"results/{wc.a}", f"results/{wc.b}"],
        names=lambda wc: [wc.a, wc.b],
        code=COMPARE_CODE,
        script=SCRIPT_HASH["compare.py"],
    script:
        "../scripts/compare.py"


# The gate: the same comparison against a threshold in the file name (gate-1.05.txt: fail above
# 1.05). It fails the job, listing each failure, and writes its file only when it passes.
rule compare_gate:
    input:
        unpack(run_files),
        report=rules.compare.output.md,
    output:
        f"{compare_dir()}/gate-{{threshold}}.txt",
    log:
        f"{compare_dir('logs')}/gate-{{threshold}}.log",
    wildcard_constraints:
        a=RUN_NAME,
        b=RUN_NAME,
        threshold=r"[0-9]+(?:\.[0-9]+)?",
    params:
        runs=lambda wc: [f"results/{wc.a}", f"results/{wc.b}"],
        names=lambda wc: [wc.a, wc.b],
        fail_above=lambda wc: float(wc.threshold),
        code=COMPARE_CODE,
        script=SCRIPT_HASH["compare.py"],
    script:
        "../scripts/compare.py"
