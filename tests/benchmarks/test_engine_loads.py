"""benchmarks.engine_loads: model loads per stage, counted from job logs as specbuild writes
them (a job's own server, a keeper's engine started or joined, a runner or a transformers
load in a job); a keeper's relayed lines are never counted twice."""

from __future__ import annotations

from benchmarks.engine_loads import count_loads, loads_table

KEEPER = "/w/.specbuild/keepers/server-0123456789abcdef"
LOGS = {
    "generate/chat/00000.log": [
        "10:00:00 INFO pinned to GPU(s) 0 (of the 1 here: 0)",
        f"10:00:00 INFO sglang-generate: starting a shared engine, kept in {KEEPER}",
    ],
    "generate/chat/00001.log": [
        f"10:03:00 INFO sglang-generate: sharing the engine kept in {KEEPER}"
    ],
    "bench/sglang/none/baseline.log": [
        f"10:05:00 INFO sglang-baseline: sharing the engine kept in {KEEPER}",
    ],
    "bench/sglang/base/3-1-4.log": [
        "10:09:35 INFO starting sglang-3-1-4: python -m sglang.launch_server --model-path t",
        "10:11:14 INFO [sglang-3-1-4] [2026-12-04 10:11:14] server_args=ServerArgs(...)",
    ],
    "bench/hf/base/3-1-4.log": [
        "10:12:00 INFO loaded the target's text model with transformers on cuda (bfloat16) in 2 s",
    ],
    "hidden/gsm8k/00000.log": [
        "10:04:02 INFO hidden: sharing the engine kept in /w/.specbuild/keepers/features-2",
        "10:04:03 INFO keeper: 10:04:03,000 loaded the target's text model with transformers on",
    ],
    "hidden/chat/00000.log": [
        "10:04:02 INFO hidden: starting a shared engine, kept in /w/.specbuild/keepers/features-1",
        "10:04:40 INFO keeper: 2026-12-04 10:04:40,000 SGLang model runner: Llama, tp 1, 9 KV",
    ],
    "align/align.log": ["10:05:43 INFO SGLang model runner: LlamaForCausalLM, tp 1, 524288 KV"],
    "tokenize/chat/00000.log": ["10:03:30 INFO tokenized 1024 rows"],
    "serve.log": ["10:00:00 INFO starting sglang-x: a run-level line, not a job's"],
}


def test_loads_are_counted_per_stage_from_the_job_logs(tmp_path):
    for name, lines in LOGS.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    rows = {r.stage: r for r in count_loads(tmp_path)}
    assert set(rows) == {"generate", "bench", "hidden", "align", "tokenize"}
    generate = rows["generate"]
    assert (generate.jobs, generate.kept_starts, generate.kept_joins) == (2, 1, 1)
    assert rows["generate"].loads == 1  # two shards, one server
    bench = rows["bench"]
    assert (bench.own_servers, bench.kept_joins, bench.own_hf, bench.loads) == (1, 1, 1, 2)
    assert rows["hidden"].loads == 1  # the keeper's relayed load lines are not loads of the job
    assert rows["align"].own_runners == rows["align"].loads == 1
    assert rows["tokenize"].loads == 0
    table = loads_table(rows.values())
    assert "| tokenize |" not in table  # loaded nothing
    assert table.splitlines()[-1] == "| all | 8 | | | | | | 5 |"
