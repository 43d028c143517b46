# Study `profile`: one job per grid cell (see cs336sys.studies for its axes and valid cells).
rule profile_cell:
    output:
        cell_csv("profile"),
    params:
        cell=cell_settings("profile"),
        code=cell_code("profile"),
        script=SCRIPT_HASH["run_cell.py"],
    resources:
        gpu=1,
        runtime=cell_resource("profile", "runtime_min", 30),
        mem_mb=cell_resource("profile", "mem_mb", 16000),
    log:
        cell_log("profile"),
    script:
        "../scripts/run_cell.py"


# Optional: an Nsight Systems report of the same cell through the CLI (profile.nsys: true).
# NVTX ranges come from the same annotations (CS336SYS_NVTX=1); no copy of the model.
rule profile_nsys:
    output:
        nsys_rep(),
    params:
        args=nsys_args,
        code=cell_code("profile"),
    resources:
        gpu=1,
    log:
        f"logs/{RUN}/profile/nsys/{{cell}}.log",
    shell:
        "CS336SYS_NVTX=1 nsys profile --trace=cuda,nvtx --force-overwrite=true "
        "-o {output:q} python -m cs336sys e2e {params.args} > {log:q} 2>&1"
