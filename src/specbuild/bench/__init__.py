"""Stage `bench` (rules/bench.smk -> scripts/bench.py -> `bench.run.run_bench`): metrics.py
(every number), rows.py (the row schema and request loops), hf.py and served.py (the engines),
sets.py (prompt sets). A chain's name and its parser live in specbuild.eagle.chain, the fit of a
drafter folder to the target in specbuild.eagle.drafter_fit: the config checks read both at parse
time, before any bench job. The server tuning sweep, which measures with these, is its own
stage (specbuild.tuning). Benchmarks of specbuild itself live outside the product, in the
repo's benchmarks/."""
