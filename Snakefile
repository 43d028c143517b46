# cs336sys: benchmark Transformer LMs and attention variants, one job per grid cell.
#   GPU box:     snakemake                  (profiles/default: one GPU job at a time)
#   no GPU:      snakemake --configfile config/cpu-demo.yaml
#   package it:  snakemake --report report.html
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/cells.smk"
include: "workflow/rules/nsys.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/compare.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
