from specbuild.io import setup_logging
from specbuild.report.tuning import write_tuning_report

setup_logging(snakemake.log[0])
write_tuning_report(list(snakemake.input), outputs=list(snakemake.output))
