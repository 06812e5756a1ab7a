#!/bin/bash
# Download, here, the wheels the H200 host needs beyond its image and the staged SGLang install:
# snakemake and its dependencies (cp312 where compiled), into .whl (~8 MB; git-ignored);
# pygments for `snakemake --report`; py-spy for benchmarks/h200/extract.sh pyspy.
# The host already has numpy, pandas, seaborn, matplotlib, safetensors, pyyaml, requests,
# jinja2, psutil, tabulate, wrapt, accelerate (not installed on the GPU machine); the staged /tmp/site has
# transformers 5.12.1, jsonschema, pydantic, traitlets, orjson.
# pulp is left out on purpose (16 MB of CBC binaries): run.sh uses --scheduler greedy.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl && mkdir -p .whl
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp"
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_5; do
  PLAT="$PLAT --platform ${p}_x86_64"
done
PKGS="snakemake==9.27.1 argparse-dataclass==2.0.0 conda-inject==1.3.2 configargparse==1.9.0
docutils==0.22.4 dpath==2.2.0 fastjsonschema==2.22.3 gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3
humanfriendly==10.0 immutables==0.21 jupyter-core==5.9.1 nbformat==5.11.1 smart-open==7.7.1
sqlmodel==0.0.37 sqlalchemy==2.0.58 greenlet==3.5.6 tenacity==9.2.1 throttler==1.2.3 yte==1.9.4
platformdirs==4.14.8 snakemake-interface-common==1.23.0
snakemake-interface-executor-plugins==9.4.0 snakemake-interface-logger-plugins==2.1.0
snakemake-interface-report-plugins==1.3.0 snakemake-interface-scheduler-plugins==2.0.2
snakemake-interface-storage-plugins==4.4.1 pygments==2.21.0 py-spy==0.4.3"
python3 -m pip download -q --no-deps $PLAT -d .whl $PKGS
# connection-pool publishes only an sdist; build its (pure-python) wheel here
python3 -m pip wheel -q --no-deps connection-pool==0.0.3 -w .whl
ls .whl | wc -l
du -sh .whl
