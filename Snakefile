# cs336sys: benchmark Transformer LMs and attention variants, one job per grid cell.
#   GPU box:     snakemake                  (profiles/default: one GPU job at a time)
#   no GPU:      snakemake --configfile config/cpu-demo.yaml
#   package it:  snakemake --report report.html
configfile: "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/e2e.smk"
include: "workflow/rules/warmup.smk"
include: "workflow/rules/attention.smk"
include: "workflow/rules/mha.smk"
include: "workflow/rules/flash.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/memory.smk"
include: "workflow/rules/precision.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        final_outputs(),
    default_target: True
