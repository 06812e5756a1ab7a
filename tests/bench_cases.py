"""Shared by the bench, tuning, report and variants tests: the loopback SGLang stub as a
launcher, the MT-Bench prompt set, and bench rows whose numbers check by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specbuild.bench.rows import ROW_KEYS

STUB = Path(__file__).resolve().parent / "stubs" / "sglang_stub.py"
LAUNCHER = (sys.executable, str(STUB))
REPO = Path(__file__).resolve().parents[1]
MT_BENCH = {
    "path": str(REPO / "resources/bench/mt_bench.jsonl"),
    "format": "turns",
    "id_key": "question_id",
}


def row(set_, chain, tokens, verify, *, wall=2.0, engine="hf", prompt="0", accepted=(), **kw):
    r = dict.fromkeys(ROW_KEYS)
    r |= {
        "set": set_,
        "prompt_id": prompt,
        "turn": 1,
        "phase": "bench",
        "concurrency": 1,
        "engine": engine,
        "device": "cpu",
        "chain": chain,
        "drafter": "none" if chain == "baseline" else "d1",
        "completion_tokens": tokens,
        "verify_steps": verify,
        "accepted_per_position": list(accepted),
        "start_s": 0.0,
        "wall_s": wall,
        "ttft_s": 0.5,
        "itl_s": (wall - 0.5) / (tokens - 1),
        "tokens_per_s": tokens / wall,
    }
    return r | kw


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
