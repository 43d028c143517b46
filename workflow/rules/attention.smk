# Study `attention`: one job per grid cell (see cs336sys.studies for its axes and valid cells).
rule attention_cell:
    output:
        cell_csv("attention"),
    params:
        cell=cell_settings("attention"),
        code=cell_code("attention"),
        script=SCRIPT_HASH["run_cell.py"],
    resources:
        gpu=1,
        runtime=cell_resource("attention", "runtime_min", 30),
        mem_mb=cell_resource("attention", "mem_mb", 16000),
    log:
        cell_log("attention"),
    script:
        "../scripts/run_cell.py"
