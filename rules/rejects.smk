# Rejected rows against max_rejected_fraction (specbuild/rejects.py). The jobs that write the
# shards never judge their rejected share, so the limit is no input of them: changing it must
# not rerun a shard, nor the hidden states and training after it.
#
# Why two rules and no limit in `params:` of the gate: Snakemake reruns a job whose params
# changed and, with it, every job that reads its output; with ancient() the reader is not
# rerun, but nor is it checked for changes of its own in that run (Snakemake skips the
# descendants of a job it reruns), so a new temperature given with a new limit would be missed.
# So the gate reads the limit when it runs and reruns only when its shard does, and the table
# (a param: every limit; read by nothing but `all`) is what a changed limit reruns: it fails,
# naming each shard over its limit.


rule rejects_check:
    """Gate one shard on its rejected share; the next stage waits for it."""
    input:
        counts="results/{stage}/{dataset}/{shard}.counts.json",
    output:
        "results/checks/{stage}/{dataset}/{shard}.json",
    log:
        "logs/checks/{stage}/{dataset}/{shard}.log",
    wildcard_constraints:
        stage="|".join(rejects.REJECT_STAGES),
    # it holds a core slot for an instant and gates the next stage: first (PRIORITY in specbuild/workflow/scheduling.py)
    priority: PRIORITY["rejects_check"]
    # in the main process: a JSON read, no job of its own on a cluster
    localrule: True
    run:
        check_rejected_share(
            counts=input.counts,
            out=output[0],
            log_path=log[0],
            **rejects.reject_limit(config, wildcards.stage, wildcards.dataset),
        )


rule rejects:
    """Every shard's rejected share against its limit; fails naming each shard over it."""
    input:
        counts=rejects.reject_counts_files(SHARDS),
    output:
        csv="results/tables/rejects.csv",
        md="results/tables/rejects.md",
    log:
        "logs/report/rejects.log",
    localrule: True
    conda:
        "../envs/specbuild.yaml"
    params:
        limits=rejects.reject_limits(config),
    script:
        "../scripts/rejects.py"
