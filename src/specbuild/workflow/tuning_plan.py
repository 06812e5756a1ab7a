"""The SGLang server tuning sweep's jobs (rules/tuning.smk, specbuild.tuning): its points and
what each reads."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from specbuild.eagle.chain import BASELINE
from specbuild.workflow.bench_plan import bench_drafter_files, served_drafter
from specbuild.workflow.paths import target_file

__all__ = [
    "HELP_FILE",
    "tuning_inputs",
    "tuning_point_args",
    "tuning_point_env",
    "tuning_points",
    "tuning_prompt_set",
]

# the server's --help, against which every point's flags are checked
HELP_FILE = "results/tuning/launch_server.help.txt"


def tuning_points(config: Mapping) -> list[str]:
    t = config["sglang"]["tuning"]
    return list(t["points"]) if t["enabled"] else []


def tuning_inputs(config: Mapping, variants: Collection[str]) -> dict:
    """Target fingerprint and the server's --help; the served drafter unless the sweep runs
    the baseline."""
    inputs = {"fp": target_file(config, "fingerprint.json"), "help": HELP_FILE}
    if config["sglang"]["tuning"]["chain"] != BASELINE:
        inputs["drafter"] = bench_drafter_files(config, variants, served_drafter(config, variants))
    return inputs


def tuning_point_args(config: Mapping, point: str) -> dict:
    return dict(config["sglang"]["tuning"]["points"][point].get("server_args", {}))


def tuning_point_env(config: Mapping, point: str) -> dict[str, str]:
    env = config["sglang"]["tuning"]["points"][point].get("env", {})
    return {k: str(v) for k, v in env.items()}


def tuning_prompt_set(config: Mapping) -> dict:
    """The first bench set: its first turns are the tuning prompts."""
    return dict(next(iter(config["bench"]["sets"].values())))
