"""specbuild.engines.server against the loopback stub (tests/stubs/sglang_stub.py) started as a
real subprocess on 127.0.0.1: the SGLang server's flag building, start/stop/failure, start-up
locks, ports, API keys and masking. These complement the GPU run; they never replace it.
(Generation through a server: tests/unit/backends/test_backends.py.)"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from specbuild.engines.gpus import startup_lock
from specbuild.engines.server import (
    ServerSpec,
    ServerStartError,
    SGLangServer,
    build_server_args,
    launcher_help,
    mask_env,
    new_api_key,
    unknown_flags,
)

STUB = Path(__file__).resolve().parents[2] / "stubs" / "sglang_stub.py"
LAUNCHER = (sys.executable, str(STUB))

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 8,
    "vocab_size": 1000,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
}


def stub_model(tmp_path: Path) -> Path:
    """A folder the stub serves: only config.json matters to it."""
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY_CONFIG))
    return d


@pytest.fixture
def model_dir(tmp_path) -> Path:
    return stub_model(tmp_path)


def spec_for(model_dir, *args: str, env=None, timeout: float = 20.0, launcher=LAUNCHER):
    return ServerSpec(
        model_path=str(model_dir),
        launcher=tuple(launcher),
        server_args=tuple(args),
        env=env or {},
        startup_timeout_s=timeout,
    )


def _closed(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except OSError:
        return True
    return False


# --- flags -----------------------------------------------------------------------------------


def test_build_server_args_renders_values_bare_booleans_lists_and_drops_false():
    args = build_server_args(
        {
            "attention_backend": "triton",
            "disable_radix_cache": True,
            "disable_cuda_graph": False,
            "chunked_prefill_size": -1,
            "cuda_graph_bs": [1, 2, 4],
            "served_model_name": None,
        }
    )
    assert args == [
        "--attention-backend",
        "triton",
        "--disable-radix-cache",
        "--chunked-prefill-size",
        "-1",
        "--cuda-graph-bs",
        "1",
        "2",
        "4",
    ]


def test_build_server_args_refuses_flags_specbuild_sets_itself():
    with pytest.raises(ValueError, match="port.*set by specbuild"):
        build_server_args({"port": 1234, "api_key": "x"})


@pytest.mark.parametrize(
    "options",
    [{"hos": "0.0.0.0"}, {"model-pa": "x"}, {"conf": "x.yaml"}, {"cuda_graph_bs": [1, "--host"]}],
)
def test_build_server_args_refuses_an_abbreviation_of_its_flags_and_a_flag_as_a_value(options):
    with pytest.raises(ValueError, match="set by specbuild itself|reads as a flag"):
        build_server_args(options)


def test_specbuilds_own_flags_come_last_so_the_value_the_server_keeps_is_specbuilds(model_dir):
    # the server's argparse takes --hos for --host and keeps the last value given
    with SGLangServer(spec_for(model_dir, "--hos", "0.0.0.0")) as srv:
        assert srv.get_json("/server_info")["host"] == "127.0.0.1"
        assert srv.command()[-4:-2] == ["--host", "127.0.0.1"]


def test_unknown_flags_are_those_missing_from_the_servers_own_help():
    help_text = launcher_help(LAUNCHER)
    args = build_server_args({"attention_backend": "triton", "attention_backnd": "x"})
    assert unknown_flags(args, help_text) == ["--attention-backnd"]


# --- server lifecycle ------------------------------------------------------------------------


def test_server_binds_loopback_on_a_free_port_and_stops_with_its_process_group(model_dir):
    with SGLangServer(spec_for(model_dir, "--disable-radix-cache")) as srv:
        assert srv.base_url.startswith("http://127.0.0.1:")
        info = srv.get_json("/server_info")
        assert info["disable_radix_cache"] is True
        pid, url = srv.proc.pid, srv.base_url + "/health"
    assert srv.proc.poll() is not None
    assert _closed(url), f"server pid {pid} still answers after stop"


def test_stop_leaves_no_process_of_the_server_group_even_one_ignoring_sigterm(model_dir):
    import os

    import specbuild.engines.server as server_mod

    spec = spec_for(model_dir, env={"SGLANG_STUB_CHILD": "1"})
    old = server_mod.STOP_GRACE_S
    server_mod.STOP_GRACE_S = 2.0  # the child ignores SIGTERM: SIGKILL comes after this
    try:
        with SGLangServer(spec) as srv:
            pgid = srv.proc.pid
    finally:
        server_mod.STOP_GRACE_S = old
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def test_server_output_goes_to_the_job_log(model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="specbuild"):
        with SGLangServer(spec_for(model_dir), name="stubby"):
            pass
    assert any("[stubby] stub: serving" in r.getMessage() for r in caplog.records)


def test_server_that_exits_at_start_raises_with_its_exit_code_and_output(model_dir):
    srv = SGLangServer(spec_for(model_dir, env={"SGLANG_STUB_EXIT": "3"}))
    with pytest.raises(ServerStartError, match=r"exited with code 3(.|\n)*failing at start"):
        srv.start()


def test_server_rejecting_a_flag_fails_the_start_instead_of_hanging(model_dir):
    with pytest.raises(ServerStartError, match="unrecognized arguments: --no-such-flag"):
        SGLangServer(spec_for(model_dir, "--no-such-flag")).start()


def test_server_never_healthy_times_out_and_is_stopped(model_dir):
    srv = SGLangServer(spec_for(model_dir, env={"SGLANG_STUB_NEVER_HEALTHY": "1"}, timeout=2))
    with pytest.raises(ServerStartError, match="not healthy"):
        srv.start()
    assert srv.proc.poll() is not None


def test_server_is_stopped_when_the_job_body_fails(model_dir):
    srv = SGLangServer(spec_for(model_dir))
    with pytest.raises(RuntimeError, match="boom"):
        with srv:
            url = srv.base_url + "/health"
            raise RuntimeError("boom")
    assert srv.proc.poll() is not None and _closed(url)


@pytest.fixture
def one_gpu(tmp_path, monkeypatch):
    """GPU 6 visible, a private lock folder: server starts take its start-up lock."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("SPECBUILD_GPU_LOCK_DIR", str(tmp_path / "locks"))


def _started(srv: SGLangServer, until, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, srv.output_tail()
        time.sleep(0.02)


def test_a_server_start_holds_its_gpu_until_its_kv_pool_is_sized(model_dir, one_gpu):
    # SGLang sizes the KV pool from the memory free before and after loading: another start
    # in between takes its share out of this one's count (two runners on one H200 failed so)
    srv = SGLangServer(spec_for(model_dir, env={"SGLANG_STUB_POOL_S": "1.5"}))
    starting = threading.Thread(target=srv.start)
    starting.start()
    try:
        _started(srv, lambda: srv.proc is not None)
        with pytest.raises(TimeoutError, match="GPU 6's start-up lock"):
            with startup_lock("second start", wait_s=0.3, poll_s=0.05):
                pass
        starting.join()
        with startup_lock("after the first start", wait_s=0):
            pass
    finally:
        starting.join()
        srv.stop()


def test_the_start_up_lock_is_let_go_once_the_pool_is_sized_not_at_health(model_dir, one_gpu):
    # a CUDA-graph capture does not change another server's pool: it need not wait for it
    srv = SGLangServer(spec_for(model_dir, env={"SGLANG_STUB_NEVER_HEALTHY": "1"}, timeout=4))
    failed: list[BaseException] = []

    def start() -> None:
        try:
            srv.start()
        except ServerStartError as err:
            failed.append(err)

    starting = threading.Thread(target=start)
    starting.start()
    try:
        _started(srv, lambda: srv._pools_sized >= 1)
        with startup_lock("next start", wait_s=3, poll_s=0.05):
            assert starting.is_alive() and not failed  # still waiting for its health
    finally:
        starting.join()
    assert failed and "not healthy" in str(failed[0])
    assert srv.proc.poll() is not None


def test_a_speculative_server_waits_for_the_draft_models_pool_too(model_dir):
    assert SGLangServer(spec_for(model_dir))._pools_expected() == 1
    spec = spec_for(model_dir, "--speculative-algorithm", "EAGLE3")
    assert SGLangServer(spec)._pools_expected() == 2


def _status(url: str, payload: dict | None = None, key: str | None = None) -> int:
    data = None if payload is None else json.dumps(payload).encode()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def test_a_port_taken_before_the_server_binds_it_is_replaced_by_another(model_dir, monkeypatch):
    import socket

    import specbuild.engines.server as server_mod

    with socket.socket() as taken:  # another process got "our" free port first
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([busy])
        real = server_mod.free_port
        monkeypatch.setattr(server_mod, "free_port", lambda host: next(picks, None) or real(host))
        with SGLangServer(spec_for(model_dir)) as srv:
            assert srv.port != busy
            assert srv.get_json("/server_info")["port"] == srv.port


def test_stub_given_a_key_answers_401_without_it_except_health(model_dir):
    key = new_api_key()
    with SGLangServer(spec_for(model_dir, launcher=(*LAUNCHER, "--api-key", key))) as srv:
        gen = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
        url = srv.base_url
        assert _status(url + "/health_generate") == 200
        assert _status(url + "/server_info") == 401
        assert _status(url + "/generate", gen) == 401
        assert _status(url + "/generate", gen, key="wrong") == 401
        assert _status(url + "/generate", gen, key=key) == 200


def test_a_server_with_a_key_is_started_with_it_and_its_own_requests_carry_it(model_dir):
    key = new_api_key()
    assert len(key) >= 32 and key != new_api_key()
    spec = ServerSpec(model_path=str(model_dir), launcher=LAUNCHER, api_key=key)
    assert key not in repr(spec)
    with SGLangServer(spec) as srv:  # the health check passed
        assert srv.get_json("/server_info")["version"] == "0.0.0-stub"
        assert _status(srv.base_url + "/server_info") == 401  # so the server has the key
        # in no command line any user of the host can read (ps), and its file is gone
        argv = Path(f"/proc/{srv.proc.pid}/cmdline").read_bytes().split(b"\0")
        assert key.encode() not in b" ".join(argv)
        key_file = Path(argv[argv.index(b"--config") + 1].decode())
        assert not key_file.exists() and not key_file.parent.exists()
        assert "--config" not in srv.command()  # read at the start only


def test_the_key_and_secret_looking_env_values_are_masked_in_the_log(
    model_dir, monkeypatch, caplog
):
    monkeypatch.setenv("SPECBUILD_TEST_SECRET", "inherited-secret-value")
    key = new_api_key()
    env = {"HF_TOKEN": "hf_abcdefghijklmnop", "NCCL_ALGO": "Ring"}
    spec = ServerSpec(model_path=str(model_dir), launcher=LAUNCHER, env=env, api_key=key)
    with caplog.at_level(logging.INFO, logger="specbuild"), SGLangServer(spec) as srv:
        srv.get_json("/server_info")
    text = caplog.text
    assert "HF_TOKEN=*** NCCL_ALGO=Ring" in text and "--config " in text
    assert "api_key='***'" in text  # the server's own print of its arguments
    for secret in (key, "hf_abcdefghijklmnop", "inherited-secret-value"):
        assert secret not in text


def test_mask_env_hides_values_of_names_that_say_secret():
    env = {"OPENAI_API_KEY": "k", "hf_token": "t", "DB_PASSWORD": "p", "X_SECRET": "s"}
    env |= {"AUTHORIZATION": "Bearer b", "DB_PASS": "q"}  # the config check's names too
    assert set(mask_env(env).values()) == {"***"}
    assert mask_env({"NCCL_ALGO": "Ring", "PORT": 5}) == {"NCCL_ALGO": "Ring", "PORT": "5"}


def test_a_secret_is_masked_by_its_shape_whatever_its_name(model_dir, monkeypatch, caplog):
    url = "postgres://user:pa55word@db.internal:5432/app"
    nvapi = "nvapi-" + "Rt5" * 20
    assert mask_env({"DATABASE_URL": url, "NGC_AUTH": nvapi, "SESSION": "Zx8" * 11}) == {
        "DATABASE_URL": "***",
        "NGC_AUTH": "***",
        "SESSION": "***",
    }
    monkeypatch.setenv("SPECBUILD_TEST_DSN", url)  # inherited, under a name that says nothing
    spec = ServerSpec(model_path=str(model_dir), launcher=LAUNCHER, env={"NGC_AUTH": nvapi})
    with caplog.at_level(logging.INFO, logger="specbuild"), SGLangServer(spec) as srv:
        assert srv.mask(f"echo {url} {nvapi}") == "echo *** ***"
    assert "NGC_AUTH=***" in caplog.text and nvapi not in caplog.text


def test_api_keys_never_look_like_a_flag_to_the_servers_argparse():
    # a key starting with "-" made `--api-key <key>` fail one server start in 32
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--api-key")
    for _ in range(2000):
        key = new_api_key()
        assert not key.startswith("-")
        assert parser.parse_args(["--api-key", key]).api_key == key


def test_a_speculative_server_out_of_memory_is_told_to_bound_its_pools():
    from specbuild.engines.server import build_server_args, draft_pool_hint

    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 97.80 GiB"
    eagle = build_server_args({"speculative_algorithm": "EAGLE3", "tp_size": 1})
    assert "max_total_tokens" in draft_pool_hint(eagle, oom)
    bounded = build_server_args({"speculative_algorithm": "EAGLE3", "max_total_tokens": 524288})
    assert draft_pool_hint(bounded, oom) == ""  # bounded already: the hint would mislead
    assert draft_pool_hint(build_server_args({"tp_size": 1}), oom) == ""  # no draft pool
    assert draft_pool_hint(eagle, "KeyError: 'lm_head.weight'") == ""  # another failure


def test_the_key_file_is_the_owners_alone_and_holds_the_key_as_sglangs_config_reads_it():
    key = "-" + new_api_key()  # a leading "-" stays a value, not a flag
    import specbuild.engines.server as server_mod

    path = server_mod._write_key_file(key)
    try:
        assert path.suffix == ".yaml"  # SGLang's --config takes YAML files only
        assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
        assert yaml.safe_load(path.read_text()) == {"api-key": key}
    finally:
        shutil.rmtree(path.parent)


def test_the_launcher_names_this_interpreter_the_same_however_it_was_started(tmp_path, monkeypatch):
    from specbuild.engines.server import resolve_launcher

    (tmp_path / "python3").write_text("")
    (tmp_path / "python").symlink_to(tmp_path / "python3")
    for started in ("python3", "python"):  # make's `.venv/bin/python3`, `python -m`'s `python`
        monkeypatch.setattr("sys.executable", str(tmp_path / started))
        assert resolve_launcher(["python3", "-m", "sglang.launch_server"])[0] == str(
            tmp_path / "python"
        )
    (tmp_path / "python").unlink()  # no plain `python` beside it: the interpreter as it is
    monkeypatch.setattr("sys.executable", str(tmp_path / "python3"))
    assert resolve_launcher(["python"])[0] == str(tmp_path / "python3")
