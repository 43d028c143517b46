# Optional: an Nsight Systems report of a profile cell through the CLI (profile.nsys: true).
# NVTX ranges come from the same annotations (CS336SYS_NVTX=1); no copy of the model.
rule profile_nsys:
    output:
        nsys_rep(),
    log:
        nsys_log(),
    resources:
        gpu=1,
    params:
        args=nsys_args,
        code=cell_code("profile"),
    shell:
        "CS336SYS_NVTX=1 nsys profile --trace=cuda,nvtx --force-overwrite=true "
        "-o {output:q} python -m cs336sys e2e {params.args} > {log:q} 2>&1"
