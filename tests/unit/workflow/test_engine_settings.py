import inspect
from dataclasses import fields

from specbuild.backends.sglang import SGLangBackend
from specbuild.engines.server import ServerOptions
from specbuild.workflow.engine_settings import (
    generate_backend_args,
    server_options_params,
    server_sharing,
    sglang_server_options,
)


def _sglang(config):
    config["generate"]["backend"] = "sglang"
    config["sglang"].update(
        launcher=["python", "-m", "sglang.launch_server"],
        server_args={"tp_size": 2},
        env={"NCCL_ALGO": "Ring", "RETRIES": 3},
        draft_attention_backend="fa3",
        request_timeout_s=30,
    )
    return config


def test_the_server_options_param_rebuilds_the_same_server(default_config):
    options = sglang_server_options(_sglang(default_config))
    param = server_options_params(options)
    assert param["launcher"] == ["python", "-m", "sglang.launch_server"]  # a list, as in params
    assert param["env"] == {"NCCL_ALGO": "Ring", "RETRIES": "3"}
    assert ServerOptions(**param).spec("m").server_args == options.spec("m").server_args
    assert ServerOptions(**param).draft_attention_backend == "fa3"


def test_the_generation_server_gets_exactly_the_sglang_backends_fields(default_config):
    args = generate_backend_args(_sglang(default_config))
    # its own keywords, and the server's by ServerOptions' field names
    own = set(inspect.signature(SGLangBackend).parameters) - {"server"}
    accepted = own | {f.name for f in fields(ServerOptions)}
    assert set(args) <= accepted
    assert "draft_attention_backend" not in args  # generation serves no drafter
    assert args["target_dir"] == f"results/target/{default_config['target']['name']}"
    assert args["request_timeout_s"] == 30 and args["server_args"] == {"tp_size": 2}


def test_an_endpoints_args_name_the_key_variable_never_a_key(default_config):
    default_config["generate"]["backend"] = "openai"
    default_config["sglang"].update(endpoint="http://h/v1", api_key_env="MY_KEY")
    args = generate_backend_args(default_config)
    assert args["api_key_env"] == "MY_KEY" and args["base_url"] == "http://h/v1"
    assert "target_dir" not in args


def test_hf_generation_takes_the_target_folder_and_its_own_settings(default_config):
    args = generate_backend_args(default_config)
    assert set(args) == {"target_dir", "dtype", "device", "batch_size"}


def test_only_jobs_that_start_sglang_servers_get_the_sharing_resource(default_config):
    default_config["sglang"]["share_idle_s"] = 45
    default_config["generate"]["backend"] = "hf"
    assert server_sharing(default_config) == ""  # hf generation starts no server
    assert server_sharing(default_config, "sglang") == "45"  # a sglang bench job or point
    assert server_sharing(default_config, "openai") == ""  # someone else's endpoint
    assert server_sharing(_sglang(default_config)) == "45"
