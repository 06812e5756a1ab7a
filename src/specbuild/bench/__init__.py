"""Stage `bench` (rules/bench.smk -> scripts/bench.py -> `bench.run.run_bench`): chain.py (the
config names), metrics.py (every number), rows.py (the row schema and request loops), hf.py
and served.py (the engines), sets.py (prompt sets), tuning.py (SGLang server tuning points).
Benchmarks of the build itself: extract.py and hostwrite.py (stage hidden), workflow.py
(Snakemake's overhead)."""
