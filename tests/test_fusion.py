import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrag_resources.serving.fusion import DEFAULT_WEIGHTS, merge_exact_into_dense, named_first, weighted_rrf

pytestmark = pytest.mark.unit


def test_rrf_scores_and_channel_detail():
    out = weighted_rrf({"dense": ["a", "b"], "fts": ["b", "c"]}, weights={"dense": 1.0, "fts": 1.0}, k=60)
    ids = [d for d, _, _ in out]
    assert ids == ["b", "a", "c"]
    b = out[0]
    assert b[1] == pytest.approx(1 / 62 + 1 / 61)
    assert b[2] == {"dense": {"rank": 2, "score": pytest.approx(1 / 62)},
                    "fts": {"rank": 1, "score": pytest.approx(1 / 61)}}


def test_weights_change_the_order():
    rankings = {"dense": ["a", "b"], "fts": ["a", "b"], "exact": ["b"]}
    # exact weighted 0: a (2/61) beats b (2/62)
    plain = [d for d, _, _ in weighted_rrf(rankings, weights={"dense": 1.0, "fts": 1.0, "exact": 0.0})]
    assert plain == ["a", "b"]
    # DEFAULT_WEIGHTS, exact counts 2: b (2/62 + 2/61) beats a (2/61)
    weighted = [d for d, _, _ in weighted_rrf(rankings)]
    assert weighted == ["b", "a"]
    # a heavier dense channel reorders two single-channel hits
    two = {"dense": ["d"], "fts": ["f"]}
    assert [d for d, _, _ in weighted_rrf(two, weights={"dense": 1.0, "fts": 1.0})] == ["d", "f"]
    assert [d for d, _, _ in weighted_rrf(two, weights={"dense": 1.0, "fts": 3.0})] == ["f", "d"]


def test_default_weights_documented_values():
    assert DEFAULT_WEIGHTS == {"dense": 1.0, "fts": 1.0, "exact": 2.0}
    out = weighted_rrf({"other": ["x"]})
    assert out[0][1] == pytest.approx(1 / 61)  # unknown channels weigh 1.0


def test_ties_broken_by_best_rank_then_id():
    out = weighted_rrf({"dense": ["b", "a"], "fts": ["a", "b"]}, weights={"dense": 1.0, "fts": 1.0})
    assert [d for d, _, _ in out] == ["a", "b"]  # equal score, equal best rank -> id
    out = weighted_rrf({"dense": ["z"], "fts": ["y"]})
    assert [d for d, _, _ in out] == ["y", "z"]


def test_duplicate_ids_in_a_channel_count_once():
    out = weighted_rrf({"dense": ["a", "a", "b"]})
    assert dict((d, s) for d, s, _ in out) == {"a": pytest.approx(1 / 61), "b": pytest.approx(1 / 62)}


def test_bad_arguments():
    with pytest.raises(ValueError):
        weighted_rrf({"dense": ["a"]}, k=-1)
    with pytest.raises(ValueError):
        weighted_rrf({"dense": ["a"]}, weights={"dense": -1.0})


def test_merge_exact_into_dense_places_by_cosine():
    dense = [("a", 0.9), ("b", 0.8), ("c", 0.7)]
    merged = merge_exact_into_dense(dense, {"x": 0.75, "b": 0.99})
    assert merged == [("a", 0.9), ("b", 0.8), ("x", 0.75), ("c", 0.7)]
    # below all: last; above all: first; equal cosine: after the dense hit
    assert merge_exact_into_dense(dense, {"y": 0.1})[-1] == ("y", 0.1)
    assert merge_exact_into_dense(dense, {"z": 0.95})[0] == ("z", 0.95)
    assert merge_exact_into_dense(dense, {"w": 0.8})[1:3] == [("b", 0.8), ("w", 0.8)]
    assert merge_exact_into_dense([], {"p": 0.2, "q": 0.5}) == [("q", 0.5), ("p", 0.2)]
    assert merge_exact_into_dense(dense, {"n": float("nan")}) == dense


ids = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
rankings_st = st.dictionaries(
    st.sampled_from(["dense", "fts", "exact", "other"]), st.lists(ids, max_size=12), max_size=4
)
weights_st = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["dense", "fts", "exact"]),
                    st.floats(min_value=0, max_value=5, allow_nan=False), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(rankings_st, weights_st, st.integers(min_value=0, max_value=100))
def test_rrf_is_a_permutation_with_non_increasing_scores(rankings, weights, k):
    out = weighted_rrf(rankings, weights=weights, k=k)
    got = [d for d, _, _ in out]
    union = set().union(*rankings.values()) if rankings else set()
    assert len(got) == len(set(got))
    assert set(got) == union
    scores = [s for _, s, _ in out]
    assert all(a >= b for a, b in zip(scores, scores[1:]))
    for _, s, detail in out:
        assert s == pytest.approx(sum(c["score"] for c in detail.values()))


def test_what_the_whole_query_names_goes_first_each_part_in_its_order():
    fused = [("doc", 0.9, {}), ("other", 0.8, {}), ("issue", 0.5, {}), ("issue-2", 0.4, {})]
    assert [e[0] for e in named_first(fused, {"issue-2", "issue"})] == ["issue", "issue-2", "doc", "other"]
    assert named_first(fused, set()) == fused
