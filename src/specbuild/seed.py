"""A data seed: one build's samples and generated shards, carried to another machine or
checkout so that its build starts at tokenize. Writing prompts and answering them is the
costly half of the data stage on a GPU (~9 minutes of the SmolLM2 H200 example, BENCHMARKS.md);
everything after it is cheap to rebuild.

`pack` writes the shards (with their counts, rejects and reject checks) as one tar.gz.
`plant` puts them in a workdir that has none: it builds the target first (a new target job
would make every shard stale by its time stamp alone), unpacks, then marks the generated
shards up to date with `snakemake --touch`, which touches them and what they derive from in
the DAG's order. Snakemake keeps no metadata for touched files, so neither params nor code
changes rerun them, only a newer input: plant a seed only into a config that asks for the
same shards (datasets, counts, shard sizes, generate settings). `--datasets` plants only the
datasets a config has (a seed from a build with more; Snakemake cannot touch a shard of a
dataset its config lacks). A plant that fails removes the files it created, so that it can be
run again.

    python -m specbuild.seed pack data.tar.gz
    python -m specbuild.seed plant data.tar.gz --datasets gsm8k,chat -- snakemake --cores 4
"""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

from specbuild.infra.io import atomic_path

__all__ = ["SEED_PATHS", "generated_shards", "pack", "plant"]

log = logging.getLogger("specbuild")

# What a seed holds, relative to the workdir: the shards `generate` reads and writes, and the
# reject checks between them (the counts and rejects files sit beside each shard).
SEED_PATHS = ("results/samples", "results/checks/samples", "results/generated")
_GENERATED = re.compile(r"^results/generated/[^/]+/[^/.]+\.jsonl$")


def generated_shards(seed: str | Path) -> list[str]:
    """The generated shards a seed holds, as workdir-relative paths."""
    with tarfile.open(seed) as tar:
        return _shards(tar.getnames())


def _shards(names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if _GENERATED.match(n))


def pack(out: str | Path, workdir: str | Path = ".") -> list[str]:
    """Write the seed of `workdir` to `out` (tar.gz, atomically); the generated shards in it."""
    root = Path(workdir)
    present = [p for p in SEED_PATHS if (root / p).is_dir()]
    if "results/generated" not in present:
        raise FileNotFoundError(f"{root.resolve()}: no results/generated to seed from")
    with atomic_path(out) as tmp, tarfile.open(tmp, "w:gz") as tar:
        for p in present:
            tar.add(root / p, p)
        return _shards(tar.getnames())


def plant(
    seed: str | Path,
    snakemake: list[str],
    workdir: str | Path = ".",
    datasets: Iterable[str] | None = None,
) -> list[str]:
    """Unpack `seed` into `workdir` after its target is built, and mark its generated shards
    up to date. `snakemake`: the command line of the build (config, cores, ...), without
    targets; `datasets`: plant only these (default: all the seed has). Returns the shards
    planted."""
    root = Path(workdir)
    with tarfile.open(seed) as tar:
        members = tar.getmembers()
        if datasets is not None:
            keep = set(datasets)
            left = sorted({d for m in members if (d := _dataset(m.name)) and d not in keep})
            if left:
                log.info("%s: dataset(s) %s not planted (not in %s)", seed, left, sorted(keep))
            members = [m for m in members if _dataset(m.name) in keep]
        shards = _shards(m.name for m in members)
        if not shards:
            raise ValueError(
                f"{seed}: no results/generated/<dataset>/<shard>.jsonl in it"
                + (f" for dataset(s) {sorted(keep)}" if datasets is not None else "")
            )
        clash = [s for s in shards if (root / s).exists()]
        if clash:  # the seed's files would replace these, and their metadata would go stale
            raise FileExistsError(
                f"{root.resolve()} already has {clash[0]} (and {len(clash) - 1} more of the "
                f"seed's shards): plant {seed} into a workdir without results/generated"
            )
        for member in members:  # all checked before anything runs or lands:
            tarfile.data_filter(member, str(root.resolve()))  # no absolute paths, links out
        subprocess.run([*snakemake, "--until", "target"], cwd=root, check=True)
        new = [root / m.name for m in members if m.isfile() and not (root / m.name).exists()]
        try:
            tar.extractall(root, members=members, filter="data")
            subprocess.run([*snakemake, "--touch", *shards], cwd=root, check=True)
        except BaseException:  # the files it created go: a second try would refuse the shards
            for path in new:
                path.unlink(missing_ok=True)
            raise
    log.info("planted %d generated shard(s) from %s", len(shards), seed)
    return shards


def _dataset(name: str) -> str | None:
    """The dataset a seed member belongs to (None: a folder above the datasets)."""
    for top in SEED_PATHS:
        if name.startswith(top + "/"):
            return name[len(top) + 1 :].split("/")[0]
    return None


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # the build's command line follows `--`, taken whole (its own flags are not ours)
    cut = argv.index("--") if "--" in argv else len(argv)
    argv, command = argv[:cut], argv[cut + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="write this workdir's seed")
    p.add_argument("out")
    p = sub.add_parser(
        "plant",
        help="build the target, unpack a seed, mark it up to date",
        usage="%(prog)s SEED [--datasets A,B] -- SNAKEMAKE_COMMAND...",
    )
    p.add_argument("seed")
    p.add_argument("--datasets", help="comma-separated: plant only these datasets' shards")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "pack":
        shards = pack(args.out)
        print(f"{args.out}: {len(shards)} generated shard(s)")
        return
    if not command:
        sys.exit("plant: give the snakemake command after --")
    if args.datasets is not None and not args.datasets.strip(","):
        sys.exit("plant: --datasets names no dataset")
    datasets = args.datasets.split(",") if args.datasets is not None else None
    shards = plant(args.seed, command, datasets=datasets)
    print(f"seeded from {args.seed}: {len(shards)} generated shard(s)")


if __name__ == "__main__":
    main()
