from specbuild.bench.tuning import write_launcher_help
from specbuild.io import setup_logging

setup_logging(snakemake.log[0])
write_launcher_help(snakemake.params.launcher, snakemake.output[0])
