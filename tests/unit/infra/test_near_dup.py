"""Near-duplicate prompts (stage `generate`): exact Jaccard over word shingles, decided in
dataset order against earlier kept prompts, the same in every process."""

import json
import os
import random
import subprocess
import sys
from itertools import combinations

import pytest

from specbuild.infra.near_dup import (
    NearDuplicateIndex,
    find_near_duplicates,
    jaccard,
    prompt_text,
    shingles,
)

TEN = "the quick brown fox jumps over the lazy dog today"  # 10 words: 6 five-word shingles


def _user(text):
    return [{"role": "user", "content": text}]


def test_jaccard_of_five_word_shingles_decides_against_the_threshold():
    a = shingles(TEN)
    assert len(a) == 6
    one_more = shingles(TEN + " again")  # 6 of its 7 shingles shared: 6/7 = 0.857
    last_changed = shingles(TEN.replace("today", "tomorrow"))  # 5 shared of 7: 0.714
    assert jaccard(a, one_more) == pytest.approx(6 / 7)
    assert jaccard(a, last_changed) == pytest.approx(5 / 7)
    index = NearDuplicateIndex(0.8)
    index.add("a", a)
    assert index.find(one_more) == ("a", pytest.approx(6 / 7))
    assert index.find(last_changed) is None


def test_case_width_and_punctuation_do_not_make_prompts_differ():
    assert shingles("The QUICK, brown fox -- jumps!") == shingles("the quick brown ｆｏｘ jumps")
    assert shingles("What is 2+2?") != shingles("What is 3+3?")  # short: one shingle, all words
    assert shingles("?!") == frozenset()


def test_only_user_turns_are_compared():
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    ]
    assert prompt_text(messages) == "Hi\nBye"


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9, 1.0])
def test_the_prefix_index_finds_exactly_the_pairs_brute_force_finds(threshold):
    rng = random.Random(threshold)
    words = [f"w{i}" for i in range(12)]
    base = [[rng.choice(words) for _ in range(rng.randint(3, 14))] for _ in range(40)]
    texts = base + [b[:-1] + [rng.choice(words)] for b in base] + [b + ["x"] for b in base[:20]]
    sets = [shingles(" ".join(t)) for t in texts]
    index = NearDuplicateIndex(threshold)
    for i, s in enumerate(sets):  # every earlier set indexed, each new one looked up first
        brute = [j for j in range(i) if jaccard(s, sets[j]) >= threshold - 1e-9]
        hit = index.find(s)
        assert (hit[0] if hit else None) == (str(brute[0]) if brute else None)
        index.add(str(i), s)
    n_pairs = sum(jaccard(a, b) >= threshold for a, b in combinations(sets, 2))
    assert n_pairs > 0  # the data does hold near-duplicates at every threshold tested


def _shard(path, texts, start):
    path.write_text(
        "".join(
            json.dumps({"id": f"d-{start + i}", "messages": _user(t)}) + "\n"
            for i, t in enumerate(texts)
        )
    )
    return path


def test_a_shard_is_checked_against_the_kept_prompts_of_earlier_shards(tmp_path):
    w = [f"w{i}" for i in range(12)]
    a, a1, a2 = " ".join(w[:10]), " ".join(w[:11]), " ".join(w[:12])
    # J(a, a1) = 6/7 and J(a1, a2) = 7/8 pass 0.8, J(a, a2) = 6/8 does not: a1 is rejected in
    # shard 0, so a2 is compared with a only and kept
    shard0 = _shard(tmp_path / "00000.jsonl", [a, a1, "something else entirely"], 0)
    rows = [
        {"id": "d-3", "messages": _user(a2)},
        {"id": "d-4", "messages": _user(a.upper())},
        {"id": "d-5", "messages": _user(a2 + "!")},
    ]
    found, n_earlier = find_near_duplicates([shard0], rows, 0.8)
    assert n_earlier == 2
    assert found == {
        "d-4": "near-duplicate of d-0 (Jaccard 1.00 >= 0.8 over 5-word shingles)",
        "d-5": "near-duplicate of d-3 (Jaccard 1.00 >= 0.8 over 5-word shingles)",
    }
    # shard 0's own decision, replayed as the first shard, is what the index above used
    assert find_near_duplicates([], [json.loads(x) for x in shard0.read_text().splitlines()], 0.8)[
        0
    ] == {"d-1": "near-duplicate of d-0 (Jaccard 0.86 >= 0.8 over 5-word shingles)"}


def test_shingle_hashes_are_the_same_in_every_process():
    code = "from specbuild.infra.near_dup import shingles; print(sorted(shingles('a b c d e f g')))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1 and outs.pop().strip() == str(sorted(shingles("a b c d e f g")))
