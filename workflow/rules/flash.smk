# Study `flash`: one job per grid cell (see cs336sys.studies for its axes and valid cells).
rule flash_cell:
    output:
        cell_csv("flash"),
    params:
        cell=cell_settings("flash"),
        code=cell_code("flash"),
        script=SCRIPT_HASH["run_cell.py"],
    resources:
        gpu=1,
        runtime=cell_resource("flash", "runtime_min", 30),
        mem_mb=cell_resource("flash", "mem_mb", 16000),
    log:
        cell_log("flash"),
    script:
        "../scripts/run_cell.py"
