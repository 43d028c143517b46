# Study `memory`: one job per grid cell (see cs336sys.studies for its axes and valid cells).
rule memory_cell:
    output:
        cell_csv("memory"),
    params:
        cell=cell_settings("memory"),
        code=cell_code("memory"),
        script=SCRIPT_HASH["run_cell.py"],
    resources:
        gpu=1,
        runtime=cell_resource("memory", "runtime_min", 30),
        mem_mb=cell_resource("memory", "mem_mb", 16000),
    log:
        cell_log("memory"),
    script:
        "../scripts/run_cell.py"
