"""benchmarks/peers/summary.py: the peers run's merged config and the figures its table reads."""

from __future__ import annotations

import yaml

from benchmarks.peers.summary import main, merge, train_figures

EXAMPLE = "config/examples/smollm2-sglang-h200.yaml"
OVERLAY = "benchmarks/peers/specforge.yaml"


def test_the_overlay_replaces_the_variants_and_merges_every_other_mapping(tmp_path, capsys):
    out = tmp_path / "config.yaml"
    main(["config", EXAMPLE, OVERLAY, str(out)])
    merged = yaml.safe_load(out.read_text())
    assert list(merged["train"]["variants"]) == ["epochs_4", "batch16", "sf_optim", "sf_all"]
    # pinned by the overlay, whatever the example's recipe: the seed's data, base at 12 epochs
    assert merged["train"]["epochs"] == 12 and merged["train"]["ttt_steps"] == 7
    assert merged["datasets"]["gsm8k"]["limit"] == 2048
    assert merged["train"]["datasets"] == ["gsm8k", "chat"]
    assert merged["datasets"]["chat"]["synthesize"] == {"count": 4096, "max_tokens": 128}
    assert merged["sglang"]["server_args"]["attention_backend"] == "triton"
    assert merged["sglang"]["tuning"]["enabled"] is False
    main(["settings", str(out)])
    assert capsys.readouterr().out.split() == [
        "4",
        "0.0005",
        "epochs_4",
        "batch16",
        "sf_optim",
        "sf_all",
    ]
    main(["with-drafter", str(out), "specforge", "/tmp/sf/drafter", str(tmp_path / "p.yaml")])
    with_peer = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert with_peer["bench"]["drafters"] == {"specforge": "/tmp/sf/drafter"}
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}


def test_train_figures_read_steps_speed_and_wall_time_from_a_train_log(tmp_path):
    log = tmp_path / "base.log"
    log.write_text(
        "23:59:50 INFO plan\n"
        "23:59:58 INFO step 10/1320 epoch 0 loss 5.1 lr 1e-4 90000 tokens/s 80 TFLOP/s MFU 8%\n"
        "00:01:10 INFO trained 5600000 tokens in 61.5 s of steps: 91057 tokens/s, 80 TFLOP/s\n"
    )
    fig = train_figures(log)
    assert fig == {
        "steps": 1320,
        "tokens": 5600000,
        "steps_s": 61.5,
        "tokens_per_s": 91057,
        "wall_s": 80,  # over midnight
    }
