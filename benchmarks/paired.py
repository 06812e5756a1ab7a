"""Drafters of two runs on the same requests: each drafter of NEW against one of REFERENCE,
per set, paired (ours / the reference, 95% bootstrap interval over requests resampled
together: `specbuild.report.tables.build_peers`). For a variant built later than the drafter
it is compared with: greedy serving of one drafter by the same SGLang on the same GPU model
repeats its rows to the last digit (BENCHMARKS.md, "SmolLM2 example: levers at 12 epochs"),
so a reference's bench rows stand in for rebuilding it. Check the rows' `device` first.

    python -m benchmarks.paired REFERENCE.jsonl NEW.jsonl [NEW.jsonl ...]   # markdown table
    python -m benchmarks.paired --across-chains REFERENCE.jsonl NEW.jsonl    # any chains

`--across-chains` pairs requests whatever chain each side served at (a block drafter's 7-1-8
against an EAGLE-3 reference at 3-1-4): tokens per verify step, each at its own verify width.
"""

from __future__ import annotations

import sys

import pandas as pd

from specbuild.eagle.chain import BASELINE
from specbuild.report.tables import build_peers, read_rows, to_markdown

__all__ = ["paired_table"]

SUFFIX = " (reference)"


def paired_table(reference: str, new: list[str], *, across_chains: bool = False) -> str:
    """The markdown table of each drafter of `new` over the drafter(s) of `reference`."""
    ref = read_rows([reference])
    ref["drafter"] = ref["drafter"] + SUFFIX  # a variant of the same name is not its own peer
    rows = read_rows(new)
    if across_chains:  # the reference, named with its chain, repeated at each new chain
        spec = ref[ref["chain"] != BASELINE].copy()
        spec["drafter"] = spec["drafter"] + " @" + spec["chain"]
        chains = sorted(set(rows["chain"]) - {BASELINE})
        ref = pd.concat([spec.assign(chain=c) for c in chains], ignore_index=True)
    devices = sorted(set(ref["device"]) | set(rows["device"]))
    peers = sorted(set(ref["drafter"]))
    table = build_peers(pd.concat([ref, rows], ignore_index=True), peers)
    if table.empty:  # no request both sides served at one chain
        return f"devices: {', '.join(devices)}\n\nno request served by both at one chain\n"
    cols = ["set", "drafter", "peer", "requests", "accept_length", "peer_accept_length"]
    return f"devices: {', '.join(devices)}\n\n" + to_markdown(
        table[[*cols, "ours_over_peer", "ratio_lo", "ratio_hi"]]
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    across = "--across-chains" in args
    args = [a for a in args if a != "--across-chains"]
    if len(args) < 2:
        sys.exit(__doc__)
    print(paired_table(args[0], args[1:], across_chains=across), end="")


if __name__ == "__main__":
    main()
