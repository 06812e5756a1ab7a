"""Stage `hidden`: EAGLE-3 features from the target, one verified safetensors shard per
tokenized shard. `extract` is a job's entry (the job's own engine or a kept one,
specbuild.engines); `core` reads the inputs, plans forward batches and writes the shard; `hf`
and `sglang` adapt an engine to features; `shards` owns the file layout and its checks;
`tokens` reads tokenized shards and gates tokenizer/template consistency; `fp8` stores aux and
last compactly."""

from specbuild.hidden.shards import check_shard, dequantize_state, read_shard, write_shard

__all__ = ["read_shard", "write_shard", "check_shard", "dequantize_state"]
