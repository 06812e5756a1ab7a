"""What the rules ask of the config: paths, shard lists, engine settings, job resources and
the bench and report plans, as functions of the (schema-filled) config dict.

rules/common.smk passes `config` in; every value a job depends on comes back as a plain
builtin, ready for `params:`, so these functions are tested without Snakemake.
"""
