"""Stage train's start: what the config resolves to on a device (attention, loss, precision).

The drafter's weights at the start (`build_drafter`, `warm_start`, the target's last layer) are
checked through whole runs in test_train.py, on its synthetic workspace.
"""

from __future__ import annotations

import torch

from specbuild.drafter import build
from specbuild.drafter.build import attention_kind, loss_kind
from specbuild.drafter.config import TrainConfig


def test_auto_is_the_reference_attention_and_loss_on_cpu_and_the_fused_loss_on_cuda():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    auto = TrainConfig(device="cpu")
    assert attention_kind(auto, cpu) == "reference" and loss_kind(auto, cpu) == "reference"
    assert loss_kind(TrainConfig(), cuda) == "fused"
    assert loss_kind(TrainConfig(loss="reference"), cuda) == "reference"  # asked for: kept


def test_cpu_bf16_falls_back_to_float32_where_the_cpu_lacks_native_bf16(monkeypatch, caplog):
    cpu = torch.device("cpu")
    cfg = TrainConfig.from_params({"precision": "bfloat16", "device": "cpu"})
    monkeypatch.setattr(build, "cpu_bf16_supported", lambda: True)
    assert build.use_autocast(cfg, cpu)
    assert not build.use_autocast(TrainConfig.from_params({"device": "cpu"}), cpu)  # auto: fp32
    monkeypatch.setattr(build, "cpu_bf16_supported", lambda: False)
    with caplog.at_level("WARNING", logger="specbuild"):
        assert not build.use_autocast(cfg, cpu)
    assert "no native bf16" in caplog.text and "training in float32" in caplog.text
