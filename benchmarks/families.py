"""Block drafters (DFlash, DSpark) trained on a built config's shards: a benchmark, not a test.

    python -m benchmarks.families [--families dflash dspark] [--drafts 7] [--layers 1]
        [--anchors 16] [--epochs 2] [--lr 2e-3] [--out results/perf/families]

Needs `make run` first (its hidden shards, vocabulary and target). Each family trains on every
hidden shard of results/hidden with the build's held-out split (train.eval_fraction 0.05), the
rest of the settings the trainer's defaults, starting its layers from the target's last ones;
then its export is decoded by the PyTorch engine on two prompts (a chat question and a count)
at 64 new tokens, beside the target alone. OUT/<family>/drafter is the folder SGLang loads
(`--speculative-algorithm DFLASH` / `DSPARK`); OUT/result.json holds, per family, the best
eval row (simulated acceptance on held-out samples), training seconds and tokens/s, and each
prompt's completion tokens, verify steps, acceptance and whether the output is the target's.
"""

from __future__ import annotations

import argparse
import glob
import json
import time
from pathlib import Path

import torch

from specbuild.bench.hf import HFBaseline, HFBlockDecoder, eos_token_ids, load_block
from specbuild.drafter.train import TrainConfig, TrainFiles, train_drafter
from specbuild.eagle.target_info import read_target_info
from specbuild.export import export_for_sglang

PROMPTS = {  # the SGLang family probe's two requests, so a served run compares line for line
    "chat_france": [{"role": "user", "content": "What is the capital of France?"}],
    "count": "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
}


def _prompt_ids(tokenizer, prompt) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer(prompt)["input_ids"]
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(text)["input_ids"]


def decode(target_dir: Path, folder: Path, family: str, max_new: int = 64) -> dict:
    """Each prompt decoded with the drafter and without it: tokens, verify steps, lossless."""
    from specbuild.eagle.target_info import load_tokenizer
    from specbuild.target import load_target_model

    target = load_target_model(target_dir, dtype="float32")
    tokenizer = load_tokenizer(target_dir)
    eos = eos_token_ids(target, tokenizer)
    drafter, ids = load_block(folder, target, target_dir)
    spec = HFBlockDecoder(target, drafter, layer_ids=ids, eos_ids=eos, drafter_name=family)
    base = HFBaseline(target, eos_ids=eos)
    out = {"chain": spec.chain}
    for name, prompt in PROMPTS.items():
        p = _prompt_ids(tokenizer, prompt)
        got, ref = spec.complete(p, max_new), base.complete(p, max_new)
        out[name] = {
            "completion_tokens": got.completion_tokens,
            "verify_steps": got.verify_steps,
            "accept_length": got.completion_tokens / max(got.verify_steps, 1),
            "lossless": got.token_ids == ref.token_ids,
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["dflash", "dspark"])
    ap.add_argument("--drafts", type=int, default=7)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--markov-rank", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/perf/families")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    shards = sorted(glob.glob("results/hidden/*/*.safetensors"))
    (fingerprint,) = glob.glob("results/target/*/fingerprint.json")
    target_dir = Path(fingerprint).parent
    read_target_info(fingerprint)  # fails early on a missing or partial target
    out, result = Path(args.out), {}
    for family in args.families:
        folder = out / family
        cfg = TrainConfig(
            family=family,
            block_drafts=args.drafts,
            block_layers=args.layers,
            block_anchors=args.anchors,
            markov_rank=args.markov_rank,
            epochs=args.epochs,
            lr=args.lr,
            token_budget=1024,
            max_length=512,
            init="target_last_layer",
            save_interval=100000,
        )
        start = time.perf_counter()
        best = train_drafter(
            files=TrainFiles(
                shards=shards,
                vocab="results/vocab/vocab.safetensors",
                target_fingerprint=fingerprint,
                best_out=str(folder / "best.safetensors"),
                metrics_out=str(folder / "metrics.jsonl"),
                state_dir=str(folder / "state"),
            ),
            config=cfg,
            threads=args.threads,
        )
        seconds = time.perf_counter() - start
        export_for_sglang(checkpoint=folder / "best.safetensors", out_dir=folder / "drafter")
        result[family] = {
            "best": best,
            "train_s": round(seconds, 1),
            "decode": decode(target_dir, folder / "drafter", family),
        }
        print(json.dumps({family: result[family]}), flush=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
