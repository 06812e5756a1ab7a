"""A data seed (benchmarks/h200/run.sh, SPECBUILD_SEED) rebuilt from a run that returned only its
generated shards (as run.sh did before it returned samples too).

Each samples shard is rebuilt from its generated rows (id, the first user turn: what synthesize
or samples wrote; `generate` reads nothing else of a sample), its rejects from the ids missing
from the shard's span, each with the reason that its text was not returned, and its counts and
rejects check from the run's own reject table, so the data report shows what that run built.

    python benchmarks/h200/restore_seed.py <unpacked run folder> .seed/data.tar.gz
"""

from __future__ import annotations

import contextlib
import csv
import shutil
import sys
import tempfile
from pathlib import Path

from specbuild.infra.io import read_jsonl
from specbuild.rejects import ShardFiles, check_rejected_share, publish_shard
from specbuild.seed import pack

LOST = "not returned by the run that built it (benchmarks/h200/restore_seed.py): text lost"


def restore(built: Path, out: Path) -> None:
    with open(built / "results/tables/rejects.csv", newline="") as fh:
        table = [r for r in csv.DictReader(fh) if r["stage"] == "samples"]
    built, out = built.resolve(), out.resolve()
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):  # paths in counts: relative
        work = Path(".")
        for r in table:
            dataset, shard = r["dataset"], r["shard"]
            generated = built / f"results/generated/{dataset}/{shard}.jsonl"
            rows = [
                {
                    "id": g["id"],
                    "messages": g["messages"][:1],
                    "source": {"restored_from": f"results/generated/{dataset}/{shard}.jsonl"},
                }
                for g in read_jsonl(generated)
            ]
            n_in, kept = int(r["in"]), {row["id"] for row in rows}
            start = int(shard) * n_in  # every shard of these datasets is full
            bad = [
                {"id": f"{dataset}-{i:07d}", "reason": LOST}
                for i in range(start, start + n_in)
                if f"{dataset}-{i:07d}" not in kept
            ]
            base = work / f"results/samples/{dataset}/{shard}"
            base.parent.mkdir(parents=True, exist_ok=True)
            publish_shard(
                ShardFiles(
                    out=f"{base}.jsonl",
                    rejected=f"{base}.rejected.jsonl",
                    counts=f"{base}.counts.json",
                ),
                rows=rows,
                bad=bad,
                n_in=n_in,
                label=f"restored {dataset}/{shard}",
                log_rejects=False,
            )
            synthetic = dataset != "gsm8k"
            check_rejected_share(
                counts=f"{base}.counts.json",
                out=work / f"results/checks/samples/{dataset}/{shard}.json",
                limit=float(r["limit"]),
                setting=f"datasets.{dataset}.synthesize.max_rejected_fraction"
                if synthetic
                else "samples.max_rejected_fraction",
            )
        shutil.copytree(built / "results/generated", work / "results/generated")
        pack(out, work)


if __name__ == "__main__":
    restore(Path(sys.argv[1]), Path(sys.argv[2]))
