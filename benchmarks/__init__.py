"""Benchmarks of specbuild itself, outside the product (nothing under src/ imports them):
extract.py and hostwrite.py (stage hidden), fp8.py (fp8 shards against bf16), fingerprint.py
(the target fingerprint), synthetic.py (the synthetic training workspace behind `make bench-
train` and the trainer's unit tests), train_speed.py and train_profile.py (that bench's run:
its tokens/s and MFU, where a step's time goes), workflow.py (Snakemake's overhead), h200/
(the scripts that run them and the example pipelines on an H200 machine). Run from the repo
root (`python -m benchmarks.<name>`); they write under results/perf/, the stage `bench` under
results/bench/."""

from pathlib import Path

PERF = Path("results/perf")  # where every benchmark here writes by default
