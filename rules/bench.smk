# Speculative decoding with the exported drafter vs greedy decoding without one, in PyTorch:
# one job per (set, chain), rows in the schema of specbuild.bench.specdec.
# With bench.exclusive, timed jobs claim every core, so two timed jobs never share the CPU.


rule bench:
    """Decode one benchmark set with one chain (or no drafter); one row per request."""
    input:
        unpack(bench_inputs),
    output:
        "results/bench/{set}/{chain}.jsonl",
    log:
        "logs/bench/{set}/{chain}.log",
    wildcard_constraints:
        set="|".join(bench_set_names()),
        chain="baseline|[0-9]+-[0-9]+-[0-9]+",
    conda:
        "../envs/specbuild.yaml"
    threads: bench_job_cores()
    resources:
        gpu=device_gpus(config["bench"]["device"]),
        mem_mb=4000,
        runtime=60,
    params:
        set_spec=bench_set_spec,
        drafter_dir=bench_drafter_dir,
        drafter_name=bench_drafter_name,
        backend=config["bench"]["backend"],
        max_new_tokens=config["bench"]["max_new_tokens"],
        dtype=config["bench"]["dtype"],
        device=config["bench"]["device"],
        threads=config["bench"]["threads"],
    script:
        "../scripts/bench.py"
