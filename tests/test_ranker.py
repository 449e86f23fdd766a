"""The learned ranker (serving/ranker.py): its features, and a model reordering the fused head.
Pure logic: a small model is trained here on made-up candidates, no store."""
import pytest

from mtrag_resources.serving import ranker as ranker_mod
from mtrag_resources.serving.ranker import FEATURES, Ranker, head_features, words

pytestmark = pytest.mark.unit


def _row(symbol, chunk_type="function", path="pkg/mod.py", text="def f(): pass", kind="code"):
    return {"symbol": symbol, "chunk_type": chunk_type, "file_path": path, "text": text, "source_kind": kind}


def test_words_split_identifiers_and_prose_alike():
    assert words("get_terminal_size") == words("getTerminalSize") == ["terminal", "size"]
    assert words("How do I prompt for passwords?") == ["prompt", "password"]


def test_features_see_the_name_the_question_writes():
    fused = [("a", 0.03, {"fts": {"rank": 1, "score": 0.016}}),
             ("b", 0.02, {"dense": {"rank": 1, "score": 0.016}, "exact": {"rank": 2, "score": 0.03}})]
    rows = {"a": _row("pkg.mod.helper", text="x" * 5000), "b": _row("pkg.termui.prompt_password", path="tests/t.py")}
    ids, feats = head_features("prompt for a password", fused, rows, {"b": 0.6})
    assert ids == ["a", "b"] and all(len(f) == len(FEATURES) for f in feats)
    f = [dict(zip(FEATURES, row)) for row in feats]
    assert f[0]["name_overlap"] == 0.0 and f[1]["name_overlap"] == 1.0
    assert f[0]["rank_fts"] == 1.0 and f[0]["rank_dense"] == ranker_mod.ABSENT_RANK
    assert f[1]["rank_exact"] == 2.0 and f[1]["is_test"] == 1.0 and f[1]["cosine"] == 0.6
    assert f[0]["log_chars"] > f[1]["log_chars"]


def test_a_model_reorders_only_the_head(tmp_path, monkeypatch):
    import lightgbm
    import numpy as np
    rng = np.random.default_rng(0)
    x, y, groups = [], [], []
    for _ in range(200):  # the relevant candidate is the one whose name holds the question's words
        for j in range(5):
            row = rng.random(len(FEATURES))
            row[FEATURES.index("name_overlap")] = 1.0 if j == 0 else 0.0
            x.append(row)
            y.append(1 if j == 0 else 0)
        groups.append(5)
    model = lightgbm.train({"objective": "lambdarank", "verbose": -1, "min_data_in_leaf": 5},
                           lightgbm.Dataset(np.array(x), np.array(y), group=groups), num_boost_round=20)
    path = tmp_path / "ranker.txt"
    model.save_model(str(path))
    monkeypatch.delenv("MTRAG_RANKER", raising=False)
    fused = [(c, 0.05 - i * 0.01, {"fts": {"rank": i + 1, "score": 0.01}}) for i, c in enumerate("abcd")]
    rows = {"a": _row("pkg.a"), "b": _row("pkg.b"), "c": _row("pkg.termui.prompt"), "d": _row("pkg.d")}
    monkeypatch.setattr(ranker_mod, "HEAD", 3)  # "d" lies beyond the head: it keeps its place
    order = [e[0] for e in Ranker(path).reorder("prompt", fused, rows, {})]
    assert order[0] == "c" and order[-1] == "d" and sorted(order) == list("abcd")
    monkeypatch.setenv("MTRAG_RANKER", "off")
    assert Ranker(path).reorder("prompt", fused, rows, {}) == fused
    assert not Ranker(tmp_path / "missing.txt").enabled
