# Study `precision`: one job per grid cell (see cs336sys.studies for its axes and valid cells).
rule precision_cell:
    output:
        cell_csv("precision"),
    params:
        cell=cell_settings("precision"),
        code=cell_code("precision"),
        script=SCRIPT_HASH["run_cell.py"],
    resources:
        gpu=1,
        runtime=cell_resource("precision", "runtime_min", 30),
        mem_mb=cell_resource("precision", "mem_mb", 16000),
    log:
        cell_log("precision"),
    script:
        "../scripts/run_cell.py"
