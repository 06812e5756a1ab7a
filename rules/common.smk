"""Rule-side lookups: the config check, wildcard constraints, and the few names the rules
share. The logic lives in specbuild.workflow (tested without Snakemake); the rules call it
with `config` and, through `job`, with their wildcards."""

import inspect
import os
import sys

from specbuild.engines.keepers import stop_all as stop_keepers
from specbuild.eagle.chain import CHAIN_PATTERN
from specbuild.config import ConfigError, check_config
from specbuild.config.files import ConfigFileError, check_configfiles
from specbuild.config import train_datasets, train_variants
from specbuild.infra.formats import (
    BENCH_ROWS,
    GENERATED_ROWS,
    SAMPLE_ROWS,
    TOKENIZED_ROWS,
)
from specbuild.rejects import check_rejected_share
from specbuild.workflow import bench_plan, datasets, engine_settings, features, paths
from specbuild.workflow import rejects, report_plan, scheduling, targets, training
from specbuild.workflow import tuning_plan
from specbuild.workflow.scheduling import PRIORITY, engine_env
from specbuild.workflow.shards import (
    DatasetFaults,
    ShardIndex,
    earlier_samples,
    shard_advice,
)


def config_source():
    """The config as given, for messages: its file(s) and the keys --config overrides."""
    files = [os.path.relpath(f) for f in workflow.overwrite_configfiles]
    given = " + ".join(files or ["config/config.yaml"])
    overrides = ", ".join(workflow.config_settings.config)
    return f"{given} with --config {overrides}" if overrides else given


SCHEMA = f"{workflow.basedir}/config/config.schema.yaml"

# Config files are data. profiles/default refuses code in them before Snakemake loads them;
# read again here for a run without that profile (`--workflow-profile none`): its YTE has
# already run by now, but no value it made reaches a job (docs/security.md).
try:
    check_configfiles(workflow.overwrite_configfiles)
except ConfigFileError as err:
    sys.exit(str(err))

# Fills the schema's defaults; one short error naming every faulty key. Exiting with the message
# alone: Snakemake prints a raised error inside "in file common.smk, line N" and a traceback line,
# which point at this check, not at the user's config.
try:
    check_config(config, schema=SCHEMA, source=config_source())
except ConfigError as err:
    sys.exit(str(err))


wildcard_constraints:
    dataset="[A-Za-z0-9_]+",
    shard="[0-9]{5}",
    variant="[A-Za-z0-9_]+",


TARGET = config["target"]["name"]

# results/ may be a symlink to a larger disk (specbuild/infra/snakemake_symlinks.py says why this is
# needed).
from specbuild.infra.snakemake_symlinks import keep_linked_output_folders

keep_linked_output_folders()

# One writer per output, whatever runs at once: each run's locks name it, a run frees only its
# own, one whose files overlap a live run's is refused naming it (specbuild/infra/snakemake_locks.py).
# A job of a run (its own parse) locks nothing.
from specbuild.infra.snakemake_locks import one_writer_per_output

if workflow.is_main_process:
    one_writer_per_output()

# A SLURM allocation's own Snakemake, running a group of one stage's shards (docs/clusters.md):
# the group's other shards still run after one fails (Snakemake passes --keep-going on to no
# cluster job), and its keeper host starts the engines the group's jobs share, each loaded
# once and stopped when this Snakemake exits (specbuild/engines/keeper_host.py).
from specbuild.engines.keeper_host import start_host
from specbuild.workflow.allocation import batch_step, keep_going

if batch_step(workflow):
    keep_going(workflow)
    if config["hidden"]["share_idle_s"] or config["sglang"]["share_idle_s"]:
        start_host()


# {variant: its whole train config}: `base` (train as given) and each of train.variants
VARIANTS = train_variants(config)

# Every dataset's shards and their digests, read once. A file that cannot be read or holds no
# record is a config fault naming its key, printed like the schema's (the message alone).
try:
    SHARDS = ShardIndex.read(config)
except DatasetFaults as err:
    sys.exit(str(ConfigError(config_source(), err.faults, SCHEMA)))
# Thousands of shards make the plan itself slow: said once, by the run's own Snakemake.
if workflow.is_main_process:
    from snakemake.logging import logger

    for line in shard_advice(config, SHARDS):
        logger.warning(line)

# The one SGLang ServerOptions param of every server specbuild starts (bench, tuning, serve)
SERVER = engine_settings.server_options_params(
    engine_settings.sglang_server_options(config)
)


def job(fn, *context):
    """`fn` as a rule's input, params or resource function: fn(*context, <wildcards>), the
    job's wildcards passed by the names of fn's parameters after `context`."""
    names = list(inspect.signature(fn).parameters)[len(context) :]

    def of_job(wildcards):
        return fn(*context, *(getattr(wildcards, name) for name in names))

    of_job.__name__ = fn.__name__
    return of_job


def target_file(name):
    """A file of the materialized target folder."""
    return paths.target_file(config, name)


def per_shard(pattern, names=None):
    """Expand a results pattern over every (dataset, shard) of datasets `names` (default: all)."""
    return SHARDS.expand(pattern, names)


def report_files(files):
    """A report rule's outputs, those the HTML report shows flagged report() (captioned
    relative to rules/)."""
    flagged = []
    for f in files:
        shown = dict(caption=f.caption, category=f.category, subcategory=f.subcategory)
        flagged.append(report(f.path, **shown) if f.caption else f.path)
    return flagged
