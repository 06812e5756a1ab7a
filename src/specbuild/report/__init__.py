"""Stage `report` (rules/report.smk): every table (tables.py) and plot (plots.py) of the HTML
report, from the bench's rows (bench.py), the tuning points (tuning.py) and the build's own
files (pipeline.py)."""
