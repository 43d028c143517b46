# One rule per study, made by one loop from the study registry (cs336sys.studies):
# each grid cell is one job that writes one CSV. A study needs nothing here.
for _study in STUDIES:

    rule:
        name:
            f"{_study}_cell"
        output:
            cell_csv(_study),
        log:
            cell_log(_study),
        benchmark:
            cell_benchmark(_study)
        resources:
            gpu=1,
            runtime=cell_resource(_study, "runtime_min"),
            mem_mb=cell_resource(_study, "mem_mb"),
            timeout_s=cell_timeout(_study),
        params:
            cell=cell_settings(_study),
            code=cell_code(_study),
            script=SCRIPT_HASH["run_cell.py"],
        script:
            "../scripts/run_cell.py"
