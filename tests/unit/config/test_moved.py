"""Keys of earlier releases (specbuild.config.moved) stop the build with a line naming the
key(s) that replace them, once each: never also as the schema's unknown key."""

from config_cases import default_config, faults

from specbuild.config.moved import is_moved, moved_faults


def test_keys_of_the_old_serving_bench_are_named_with_the_keys_that_replace_them():
    cfg = default_config()
    cfg["sglang"]["bench"] = {"enabled": True, "chains": ["3-1-4"], "concurrency": [1, 8]}
    cfg["bench"]["device"] = "cuda"
    assert faults(cfg) == [
        "sglang.bench: moved to bench (one stage for every engine): enabled -> add sglang to "
        "bench.engines; chains -> bench.chains; concurrency -> bench.concurrency",
        "bench.device: moved to bench.hf.device",
    ]


def test_the_single_bench_drafter_keys_are_refused_naming_their_successors():
    cfg = default_config()
    cfg["bench"] |= {"drafter": "results/drafter/base", "drafter_name": "mine"}
    got = faults(cfg)
    assert len(got) == 2
    assert got[0].startswith("bench.drafter: moved to bench.variants (which of ours")
    assert "bench.drafters (name: folder" in got[0]
    assert got[1].startswith("bench.drafter_name: moved to the rows' `drafter`")


def test_a_moved_key_covers_the_keys_below_it_and_no_key_beside_it():
    moved = moved_faults({"sglang": {"bench": {"enabled": True}}})
    assert is_moved("sglang.bench: unknown key", moved)
    assert is_moved("sglang.bench.enabled: unknown key", moved)
    assert not is_moved("sglang.benchmark: unknown key", moved)


def test_a_config_of_this_release_has_no_moved_key():
    assert moved_faults(default_config()) == []
