# Study `mha`: one job per grid cell (see cs336sys.studies for its axes and valid cells).
rule mha_cell:
    output:
        cell_csv("mha"),
    params:
        cell=cell_settings("mha"),
        code=cell_code("mha"),
        script=SCRIPT_HASH["run_cell.py"],
    resources:
        gpu=1,
        runtime=cell_resource("mha", "runtime_min", 30),
        mem_mb=cell_resource("mha", "mem_mb", 16000),
    log:
        cell_log("mha"),
    script:
        "../scripts/run_cell.py"
