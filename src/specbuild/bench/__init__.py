"""Stage `bench` (rules/bench.smk -> scripts/bench.py -> `bench.run.run_bench`): chain.py (the
config names), metrics.py (every number), rows.py (the row schema and request loops), hf.py
and served.py (the engines), sets.py (prompt sets); the server tuning sweep, which measures
with these, is its own stage (specbuild.tuning).
Benchmarks of specbuild itself live outside the product, in the repo's benchmarks/."""
