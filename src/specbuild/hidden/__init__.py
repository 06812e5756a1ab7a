"""Stage `hidden`: EAGLE-3 features from the target, one verified safetensors shard per
tokenized shard. `extract` runs backends and publishes; `shards` owns the file layout and its
checks; `tokens` reads tokenized shards and gates tokenizer/template consistency; `fp8` stores
aux and last compactly."""

from specbuild.hidden.shards import check_shard, dequantize_state, read_shard, write_shard

__all__ = ["read_shard", "write_shard", "check_shard", "dequantize_state"]
