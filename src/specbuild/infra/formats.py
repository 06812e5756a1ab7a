"""What files stages hand each other hold: the versions of a stage's rows, and the files of an
exported drafter folder.

Each row version is a param of its stage's rule, so shards an older specbuild wrote are
rebuilt, not mixed with rows that mean something else."""

from __future__ import annotations

__all__ = [
    "BENCH_ROWS",
    "DRAFTER_FILES",
    "GENERATED_ROWS",
    "SAMPLE_ROWS",
    "TOKENIZED_ROWS",
    "TOOL_CALL_ROWS",
]

# 2: assistant turns before the first user turn dropped (the row's `repairs`); a conversation
# the chat template cannot render rejected with its line
# 3: records read by specbuild.infra.records (a key twice, nesting too deep, NaN rejected); a
# record with one of the target's special tokens typed as text rejected (special_text)
SAMPLE_ROWS = 3
# 4: an assistant turn's tool_calls kept with it (were dropped), for tokenize to render or
# reject. Only a shard whose records hold tool calls makes other rows than at 3, so only its
# digest says 4 (`samples.record_digests`): upgrading reruns those shards, not every build.
TOOL_CALL_ROWS = 4

# 2: `regenerate` answers every assistant turn on the target's own earlier answers
GENERATED_ROWS = 2
# 2: a row per assistant turn where the template drops earlier reasoning; an overlong row
# drops its oldest exchanges first; any failing record is rejected by id
TOKENIZED_ROWS = 2

# The files of an exported drafter folder, what SGLang loads (docs/DESIGN.md, stage export);
# `export` may add a README or metrics file beside them (specbuild.export.ALLOWED_EXTRA_FILES).
DRAFTER_FILES = ("config.json", "model.safetensors")

# 2: the row's drafting shape is `chain` (was `config`), the name its wildcard and config key
# `bench.chains` give it
BENCH_ROWS = 2
