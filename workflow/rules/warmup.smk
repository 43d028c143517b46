# Study `warmup`: one job per grid cell (see cs336sys.studies for its axes and valid cells).
rule warmup_cell:
    output:
        cell_csv("warmup"),
    params:
        cell=cell_settings("warmup"),
        code=cell_code("warmup"),
        script=SCRIPT_HASH["run_cell.py"],
    resources:
        gpu=1,
        runtime=cell_resource("warmup", "runtime_min", 30),
        mem_mb=cell_resource("warmup", "mem_mb", 16000),
    log:
        cell_log("warmup"),
    script:
        "../scripts/run_cell.py"
