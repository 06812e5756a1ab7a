from specbuild.infra.formats import DRAFTER_FILES
from specbuild.workflow.paths import (
    bench_row_file,
    drafter_folder_files,
    target_file,
    variant_drafter_folder,
)


def test_a_drafter_folder_lists_exactly_the_files_export_writes():
    files = drafter_folder_files(variant_drafter_folder("base"))
    assert files == ["results/drafter/base/config.json", "results/drafter/base/model.safetensors"]
    assert [f.rsplit("/", 1)[1] for f in files] == list(DRAFTER_FILES)


def test_target_files_sit_in_the_target_named_by_config(default_config):
    default_config["target"]["name"] = "tiny"
    assert target_file(default_config, "fingerprint.json") == "results/target/tiny/fingerprint.json"


def test_bench_rows_are_filed_by_engine_drafter_and_chain():
    assert bench_row_file("hf", "none", "baseline") == "results/bench/hf/none/baseline.jsonl"
