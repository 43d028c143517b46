# One rule per study and pass, made by one loop from the study registry (cs336sys.studies):
# each grid cell is one job per pass that writes one CSV. A study needs nothing here.
# Pass k of every cell outranks pass k+1 of any (priority), so one cell's passes lie
# minutes apart and together see how the host drifts over the sweep (analysis.passes);
# inside a pass the longest expected cells go first (pipeline.priorities).
for _study in STUDIES:
    for _k in range(passes(_study)):

        rule:
            name:
                f"{_study}_cell" if _k == 0 else f"{_study}_pass{_k}"
            output:
                cell_csv(_study, _k),
            log:
                cell_log(_study, _k),
            benchmark:
                cell_benchmark(_study, _k)
            priority: cell_priority(_study, _k)
            threads: CELL_THREADS
            resources:
                gpu=1,
                runtime=cell_resource(_study, "runtime_min"),
                mem_mb=cell_resource(_study, "mem_mb"),
                timeout_s=cell_timeout(_study),
                warm=int(config["warm_worker"]),
                # a resource, not a param: asking to replace earlier rows reruns nothing (pipeline.keeprows)
                overwrite=int(config["overwrite"]),
                passes=passes(_study),  # each pass takes its share of the comparisons' pairs and budget
            params:
                cell=cell_params(_study, _k),
                code=cell_code(_study),
                script=SCRIPT_HASH["run_cell.py"],
                plan=sweep_plan(),
            script:
                "../scripts/run_cell.py"
