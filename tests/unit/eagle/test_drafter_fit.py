"""bench.drafters folders against the target, before any job: what can be checked is, and a
target not downloaded yet is said to leave the rest to the bench job."""

import json

import numpy as np
from safetensors.numpy import save_file

from specbuild.eagle.drafter_fit import external_drafter_faults, fit_faults
from specbuild.eagle.drafter_tensors import DrafterShape, tensor_names, tensor_shapes

TARGET = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "vocab_size": 49152,
}


def _folder(path, **config):
    """A drafter folder: `config` as its config.json, and every tensor an EAGLE-3 drafter has,
    each of one element (a config.json without every size decides no shape)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    tensors = {name: np.zeros(1, np.float32) for name in tensor_names()}
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_a_fitting_drafter_has_no_faults_and_gets_sglangs_layers():
    eagle = {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}
    assert fit_faults({"hidden_size": 576, "eagle_config": eagle}, TARGET) == ([], [1, 14, 26])
    assert fit_faults({"hidden_size": 576}, TARGET) == ([], [1, 14, 26])  # SGLang's default


def test_hidden_size_stands_for_target_hidden_size_when_a_drafter_has_none():
    faults, _ = fit_faults({"hidden_size": 4096, "draft_vocab_size": 60000}, TARGET)
    assert faults == [
        "hidden_size is 4096, the target has 576",
        "draft_vocab_size is 60000: not within the target's vocabulary (49152)",
    ]


def test_a_multimodal_wrappers_text_config_is_the_target():
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": TARGET}
    faults, _ = fit_faults({"target_hidden_size": 7168}, wrapper)
    assert faults == ["target_hidden_size is 7168, the target has 576"]


def test_a_hub_target_not_downloaded_checks_the_folders_and_says_what_waits(tmp_path):
    _folder(tmp_path / "wide", hidden_size=4096)  # unknowable now: no fault yet
    (tmp_path / "bare").mkdir()
    faults = external_drafter_faults(
        {"wide": "wide", "bare": "bare"},
        workdir=tmp_path,
        target_name="kimi",
        source="moonshotai/Kimi-K2.5",
    )
    assert len(faults) == 2
    assert faults[0].startswith("bench.drafters.bare: 'bare' has no config.json or model")
    assert faults[1] == (
        "bench.drafters: the target (moonshotai/Kimi-K2.5) is not materialized yet, so only "
        "the folder and its config.json are checked now; hidden size, vocabulary and layer "
        "ids are checked by the bench job"
    )


def test_a_local_target_folder_is_read_before_it_is_materialized(tmp_path):
    (tmp_path / "models" / "t").mkdir(parents=True)
    (tmp_path / "models" / "t" / "config.json").write_text(json.dumps(TARGET))
    _folder(tmp_path / "wide", hidden_size=4096)
    faults = external_drafter_faults(
        {"wide": "wide"}, workdir=tmp_path, target_name="t", source="models/t"
    )
    assert len(faults) == 1
    assert faults[0].startswith(
        f"bench.drafters.wide: wide does not fit the target (config.json of "
        f"{tmp_path}/models/t/config.json): hidden_size is 4096, the target has 576; point it"
    )


def test_a_target_folder_built_from_another_source_is_not_read(tmp_path):
    built = tmp_path / "results" / "target" / "t"
    built.mkdir(parents=True)
    (built / "config.json").write_text(json.dumps({**TARGET, "hidden_size": 4096}))
    (built / "fingerprint.json").write_text(json.dumps({"source": "models/old"}))
    (tmp_path / "models" / "t").mkdir(parents=True)
    (tmp_path / "models" / "t" / "config.json").write_text(json.dumps(TARGET))
    _folder(tmp_path / "wide", hidden_size=4096)
    kw = {"workdir": tmp_path, "target_name": "t"}
    # target.source is now models/t: its own config.json decides, not the earlier build's
    (fault,) = external_drafter_faults({"wide": "wide"}, source="models/t", **kw)
    assert "the target has 576" in fault and "models/t/config.json" in fault
    # built from the source the config names: the materialized folder is read
    (built / "fingerprint.json").write_text(json.dumps({"source": "models/t"}))
    (built / "config.json").write_text(json.dumps(TARGET))
    (fault,) = external_drafter_faults({"wide": "wide"}, source="models/t", **kw)
    assert "results/target/t/config.json" in fault


def _materialized(tmp_path):
    """A target folder built from the config's source (its fingerprint.json says so)."""
    built = tmp_path / "results" / "target" / "t"
    built.mkdir(parents=True)
    (built / "config.json").write_text(json.dumps(TARGET))
    (built / "fingerprint.json").write_text(json.dumps({"source": "models/t"}))


def test_a_truncated_drafter_is_refused_at_parse_time_naming_the_key_and_the_file(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file as save

    folder = _folder(tmp_path / "theirs", hidden_size=576)
    weights = folder / "model.safetensors"
    save({"fc.weight": np.ones((8, 8), np.float32)}, str(weights))
    weights.write_bytes(weights.read_bytes()[:-100])  # a copy that did not finish
    _materialized(tmp_path)
    (fault,) = external_drafter_faults(
        {"theirs": "theirs"}, workdir=tmp_path, target_name="t", source="models/t"
    )
    assert fault.startswith(
        "bench.drafters.theirs: theirs/model.safetensors: its tensors declare 256 bytes of "
        "data, the file holds 156: truncated"
    )
    assert fault.endswith("(a folder built elsewhere is not rebuilt by this workflow)")


def test_a_drafter_whose_header_claims_2_to_the_62_bytes_is_refused_before_any_target(tmp_path):
    folder = _folder(tmp_path / "theirs", hidden_size=576)
    (folder / "model.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{}")
    (fault,) = external_drafter_faults(
        {"theirs": "theirs"}, workdir=tmp_path, target_name="kimi", source="moonshotai/Kimi-K2.5"
    )
    assert fault.startswith(
        f"bench.drafters.theirs: theirs/model.safetensors: its header claims {2**62:,} bytes"
    )


# a drafter for TARGET with every size in its config.json, as stage export writes one
SIZES = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "draft_vocab_size": 256,
}


def _drafter(path, rename=None, shapes=None):
    """A folder of TARGET's drafter with its tensors as config.json implies them, `rename`
    {old: new} and `shapes` {name: shape} changed."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(SIZES))
    want = tensor_shapes(DrafterShape.from_config(SIZES)) | (shapes or {})
    tensors = {(rename or {}).get(n, n): np.zeros(dims, np.uint8) for n, dims in want.items()}
    tensors["embed_tokens.weight"] = np.zeros(1, np.uint8)  # carried, never used: allowed
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_a_drafter_with_a_renamed_tensor_is_refused_naming_the_key_folder_and_names(tmp_path):
    _drafter(tmp_path / "theirs", rename={"fc.weight": "fcx.weight"})
    _drafter(tmp_path / "fine")
    _materialized(tmp_path)
    kw = {"workdir": tmp_path, "target_name": "t", "source": "models/t"}
    (fault,) = external_drafter_faults({"theirs": "theirs", "fine": "fine"}, **kw)
    assert fault.startswith(
        "bench.drafters.theirs: theirs/model.safetensors: no tensor 'fc.weight', which its "
        "config.json implies; unexpected tensor 'fcx.weight' (SGLang skips a name it does not "
        "know"
    )
    assert fault.endswith("(a folder built elsewhere is not rebuilt by this workflow)")


def test_a_drafter_with_a_tensor_of_another_shape_is_refused_naming_it(tmp_path):
    _drafter(tmp_path / "theirs", shapes={"lm_head.weight": [300, 576]})
    _materialized(tmp_path)
    kw = {"workdir": tmp_path, "target_name": "t", "source": "models/t"}
    (fault,) = external_drafter_faults({"theirs": "theirs"}, **kw)
    assert fault.startswith(
        "bench.drafters.theirs: theirs/model.safetensors: tensor 'lm_head.weight' has shape "
        "[300, 576], its config.json implies [256, 576]"
    )


def test_the_tensor_names_are_those_stage_export_writes():
    from specbuild.drafter.config import DrafterConfig
    from specbuild.export import expected_tensors

    cfg = DrafterConfig.from_export({**SIZES, "rms_norm_eps": 1e-5, "max_position_embeddings": 8})
    want = tensor_shapes(DrafterShape.from_config(SIZES))
    assert {n: s for n, (s, _) in expected_tensors(cfg, "bfloat16").items()} == want
    assert list(want) == tensor_names()
    assert len(tensor_names(fc_norm=True)) == len(want) + 3
