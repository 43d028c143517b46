# Study `e2e`: one job per grid cell (see cs336sys.studies for its axes and valid cells).
rule e2e_cell:
    output:
        cell_csv("e2e"),
    params:
        cell=cell_settings("e2e"),
        code=cell_code("e2e"),
        script=SCRIPT_HASH["run_cell.py"],
    resources:
        gpu=1,
        runtime=cell_resource("e2e", "runtime_min", 30),
        mem_mb=cell_resource("e2e", "mem_mb", 16000),
    log:
        cell_log("e2e"),
    script:
        "../scripts/run_cell.py"
