# Merge cells per study, draw each study's figures, write the report.
# `snakemake --report report.html` opens on workflow.rst, which includes the page of rule report_html.
report: "../report/workflow.rst"


from cs336sys.pipeline.finish import finished_message, missing_report_message
from cs336sys.runs.captions import FigureCaptions


# A finished run says where its report and answers are (Snakemake calls this hook after a run that
# did something, not after a dry run); `--report` without a run to package says why, and on a
# machine without a GPU points to the demo's report (cs336sys.pipeline.finish).
onsuccess:
    print(
        finished_message(
            RUN,
            report_md(),
            answers_md(),
            workflow.config_settings.configfiles,
            workflow.config_settings.config,
        )
    )


_missing_report = missing_report_message(
    sys.argv[1:],
    RUN,
    report_md(),
    lambda: config["device"] == "cuda" and not visible_gpus(),
    workflow.config_settings.configfiles,
    workflow.config_settings.config,
)
if _missing_report:
    raise WorkflowError(_missing_report)


rule merge:
    input:
        study_cells,
    output:
        report(
            study_csv(),
            caption="../report/merged.rst",
            category="Results",
            subcategory="{study}",
            labels={"table": "merged cells (CSV)", "study": "{study}"},
        ),
    log:
        f"logs/{RUN}/merge/{{study}}.log",
    params:
        peak_tflops=config["peak_tflops"],
        peak_gbps=config["peak_gbps"],
        flags=config["flags"],
        floor_rel=config["interval_floor_rel"],
        code=MERGE_CODE,
        script=SCRIPT_HASH["merge.py"],
    script:
        "../scripts/merge.py"


rule plots:
    input:
        study_csv(),
    output:
        report(
            directory(figure_dir()),
            patterns=["{name}.png"],
            caption="../report/figures.rst",
            category="Figures",
            subcategory="{study}",
            labels={"figure": "{name}", "study": "{study}"},
        ),
    log:
        f"logs/{RUN}/plots/{{study}}.log",
    params:
        run=RUN,
        code=plot_code,
        script=SCRIPT_HASH["plot.py"],
        # the captions of figures.rst above come from the study's own folder (cs336sys.runs.captions)
        captions=lambda wildcards: FigureCaptions(wildcards.study),
    script:
        "../scripts/plot.py"


# The run's own settings, validated and with every default: its report is written from this
# file, not from whatever config.yaml says later.
rule snapshot:
    output:
        config_snapshot(),
    log:
        f"logs/{RUN}/snapshot.log",
    # before the cells: a sweep cut short still has the settings its slice is reported with
    priority: SNAPSHOT_PRIORITY
    params:
        config=run_settings(),
    script:
        "../scripts/snapshot.py"


rule report:
    input:
        csvs=expand(study_csv("{s}"), s=STUDIES),
        figures=expand(figure_dir("{s}"), s=STUDIES),
        snapshot=config_snapshot(),
    output:
        report(report_md(), caption="../report/report.rst", category="Report", labels={"file": "report.md"}),
    log:
        f"logs/{RUN}/report.log",
    params:
        run=RUN,
        studies=STUDIES,
        benchmarks=benchmark_dir(),
        code=REPORT_CODE,
        script=SCRIPT_HASH["report.py"],
    script:
        "../scripts/report.py"


# Each benchmarking question of the handout, answered from the merged CSVs (report/<run>/answers.md).
ANSWERS_CODE = modules_hash(module_closure(["cs336sys.handout.answers", *_REPORTS]))


localrules:
    answers,


rule answers:
    input:
        csvs=expand(study_csv("{s}"), s=STUDIES),
        snapshot=config_snapshot(),
    output:
        report(
            answers_md(), caption="../report/answers.rst", category="Report", labels={"file": "answers.md"}
        ),
    log:
        f"logs/{RUN}/answers.log",
    params:
        run=RUN,
        studies=STUDIES,
        code=ANSWERS_CODE,
        script=SCRIPT_HASH["answers.py"],
    script:
        "../scripts/answers.py"


# report.md and answers.md as one HTML page, figures embedded (the report's landing page, through
# ../report/workflow.rst), and each merged CSV as an HTML table: Snakemake's report shows HTML
# results in the browser, while .md and .csv results are downloads. Both paths sit beside report.md.
HTML_CODE = modules_hash(module_closure(["cs336sys.runs.html"]))


localrules:
    report_html,


rule report_html:
    input:
        md=report_md(),
        answers=answers_md(),
        figures=expand(figure_dir("{s}"), s=STUDIES),
        csvs=expand(study_csv("{s}"), s=STUDIES),
    output:
        page=report(
            report_html(),
            caption="../report/report_html.rst",
            category="Report",
            labels={"file": "report.html"},
        ),
        tables=report(
            directory(table_pages()),
            patterns=["{study}.html"],
            caption="../report/table.rst",
            category="Results",
            subcategory="{study}",
            labels={"table": "merged cells", "study": "{study}"},
        ),
    log:
        f"logs/{RUN}/report_html.log",
    params:
        run=RUN,
        studies=STUDIES,
        code=HTML_CODE,
        script=SCRIPT_HASH["report_html.py"],
    script:
        "../scripts/report_html.py"
