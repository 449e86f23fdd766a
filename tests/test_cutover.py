"""The cut-over's refusals (publish/cutover.py) on real manifest folders: a shadow whose golden
ranks fall through the gate, or whose chunk sets the live graph does not hold, leaves CURRENT as
it was; `--accept-quality-drop` cuts over and records the drop; a rollback needs a cut-over to
undo and the generation it replaced. The whole path, stores and readers included, is
tests/test_shadow.py's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings, env, served_environment
from mtrag_resources.core.errors import ConfigError, PublishError
from mtrag_resources.core.layout import current_path
from mtrag_resources.publish import cutover
from mtrag_resources.publish.golden import judge, load_golden
from mtrag_resources.publish.manifest import load_current, publish
from tests.test_golden_gate import GOLDEN

pytestmark = pytest.mark.unit

SERVING = {"profile": "fp32", "fusion": {"fts": 2.0}, "environment": {"MTRAG_EMBED_BACKEND": "onnx"}}


def _homes(tmp_path: Path, shadow_chunks: str = "c1") -> tuple[Settings, Settings, object]:
    golden_path = tmp_path / "golden.yaml"
    golden_path.write_text(GOLDEN.format(name="lookup_rate"))
    golden = load_golden(golden_path)
    live, shadow = Settings(home=tmp_path / "live"), Settings(home=tmp_path / "live" / "shadows" / "fp32")
    quality = judge(golden, {"lookup-rate": 1, "cart-total": 1, "guide": 2}, None).record
    for settings, chunks, extra in ((live, "c1", {"quality": quality}), (shadow, shadow_chunks, {})):
        settings.manifest_dir.mkdir(parents=True)
        publish(settings.manifest_dir, {"generation": 1, "sources": {"shop": {"chunk_generation": chunks}},
                                        "links": {"generation": "l1"}, "stores": {}, **extra})
    return live, shadow, golden


def test_a_golden_drop_refuses_and_leaves_current(tmp_path):
    live, shadow, golden = _homes(tmp_path)
    before = current_path(live.manifest_dir).read_bytes()
    with pytest.raises(cutover.CutoverRefused, match="cart-total: rank 1 -> not in top 3"):
        cutover.promote(live, shadow, SERVING, golden, {"lookup-rate": 1, "cart-total": None, "guide": None})
    assert current_path(live.manifest_dir).read_bytes() == before
    served = cutover.promote(live, shadow, SERVING, golden, {"lookup-rate": 1, "cart-total": None, "guide": None},
                             accept_quality_drop=True)
    assert load_current(live.manifest_dir)["generation"] == served["generation"] == 2
    assert served["quality"]["accepted_drop"]["how"] == "mtrag cutover --accept-quality-drop"
    assert served["stores_home"] == str(shadow.home) and served["cutover"]["previous"] == 1


def test_a_shadow_of_other_chunk_sets_is_refused(tmp_path):
    live, shadow, golden = _homes(tmp_path, shadow_chunks="c2")
    with pytest.raises(cutover.CutoverRefused, match=r"the sources \['shop'\] differ from live generation 1"):
        cutover.promote(live, shadow, SERVING, golden, {"lookup-rate": 1, "cart-total": 1, "guide": 1})
    assert load_current(live.manifest_dir)["generation"] == 1


def test_rollback_needs_a_cut_over_and_what_it_replaced(tmp_path):
    live, shadow, golden = _homes(tmp_path)
    with pytest.raises(ConfigError, match="generation 1 is not a cut-over; nothing to roll back"):
        cutover.rollback(live)
    cutover.promote(live, shadow, SERVING, golden, {"lookup-rate": 1, "cart-total": 1, "guide": 1})
    (live.manifest_dir / "manifest-1.json").unlink()
    with pytest.raises(PublishError, match="manifest-1.json: the generation the cut-over replaced is gone"):
        cutover.rollback(live)
    assert load_current(live.manifest_dir)["generation"] == 2


def test_a_served_profile_answers_the_embedder_variables_of_its_home(tmp_path, monkeypatch):
    live, shadow, golden = _homes(tmp_path)
    monkeypatch.setenv("MTRAG_HOME", str(live.home))
    monkeypatch.delenv("MTRAG_EMBED_BACKEND", raising=False)
    assert env("MTRAG_EMBED_BACKEND") == ""
    cutover.promote(live, shadow, SERVING, golden, {"lookup-rate": 1, "cart-total": 1, "guide": 1})
    assert served_environment(live.home) == {"MTRAG_EMBED_BACKEND": "onnx"}
    assert env("MTRAG_EMBED_BACKEND") == "onnx"  # every build of this home embeds as the served profile
    monkeypatch.setenv("MTRAG_EMBED_BACKEND", "torch")
    assert env("MTRAG_EMBED_BACKEND") == "torch"  # the process's own setting wins
    monkeypatch.delenv("MTRAG_EMBED_BACKEND")
    cutover.rollback(live)
    assert env("MTRAG_EMBED_BACKEND") == "" and json.loads(
        (live.manifest_dir / "manifest-3.json").read_text())["rollback"]["restored"] == 1


def test_a_profile_of_read_time_settings_is_cut_over_without_a_shadow(tmp_path):
    live, shadow, golden = _homes(tmp_path)
    weights = {"profile": "fts-heavy", "fusion": {"fts": 4.0}, "environment": {"MTRAG_RANKER": "off"}}
    served = cutover.promote(live, None, weights, golden, {"lookup-rate": 1, "cart-total": 1, "guide": 1})
    assert served["generation"] == 2 and "stores_home" not in served and served["serving"] == weights
    assert served["cutover"] == {**served["cutover"], "previous": 1, "shadow_generation": None}
    with pytest.raises(ConfigError, match="serves profile 'fts-heavy'; `mtrag rollback`"):
        cutover.promote(live, None, weights, golden, {"lookup-rate": 1, "cart-total": 1, "guide": 1})


def test_the_shadow_gate_ranks_are_reused_only_for_its_golden_file_and_profile(tmp_path):
    live, shadow, golden = _homes(tmp_path)
    ranks = {"lookup-rate": 1, "cart-total": 2, "guide": None}
    measured = {"serving": SERVING, "quality": judge(golden, ranks, None).record}
    assert cutover.gated_ranks(measured, golden, SERVING) == ranks
    assert cutover.gated_ranks(measured, golden, {**SERVING, "fusion": {"fts": 3.0}}) is None
    (tmp_path / "golden.yaml").write_text(GOLDEN.format(name="find_regional_rate"))
    assert cutover.gated_ranks(measured, load_golden(tmp_path / "golden.yaml"), SERVING) is None


def test_a_profile_s_serving_block_names_what_it_sets():
    from mtrag_resources.core.profiles import Profile, serving_block
    profile = Profile(name="fp32", embedder={"backend": "onnx"}, fusion={"fts": 2.0}, ranker="off")
    assert serving_block(profile.as_dict()) == {
        "profile": "fp32", "fusion": {"fts": 2.0},
        "environment": {"MTRAG_EMBED_BACKEND": "onnx", "MTRAG_RANKER": "off"}}


def test_a_read_time_profile_s_measured_ranks_hold_for_the_generation_measured(tmp_path):
    live, shadow, golden = _homes(tmp_path)
    weights = {"profile": "fts-heavy", "fusion": {"fts": 4.0}, "environment": {}}
    ranks = {"lookup-rate": 1, "cart-total": 1, "guide": 3}
    cutover.record_measured(shadow.home, 1, weights, golden, ranks)
    assert cutover.measured_ranks(shadow.home, 1, golden, weights) == ranks
    assert cutover.measured_ranks(shadow.home, 2, golden, weights) is None  # live moved since
    assert cutover.measured_ranks(shadow.home, 1, golden, {**weights, "fusion": {"fts": 2.0}}) is None
    assert cutover.measured_ranks(tmp_path / "nowhere", 1, golden, weights) is None


def test_a_cut_over_waits_for_a_publish_in_progress(tmp_path):
    """A build's publish step holds the publish lock from reading CURRENT to moving it: a cut-over
    in another thread (or process) waits, then numbers after what the publish wrote."""
    import threading
    import time
    from mtrag_resources.publish.build_state import publish_lock
    live, shadow, golden = _homes(tmp_path)
    done: list = []
    with publish_lock(live):
        waiting = threading.Thread(target=lambda: done.append(cutover.promote(
            live, shadow, SERVING, golden, {"lookup-rate": 1, "cart-total": 1, "guide": 1})))
        waiting.start()
        time.sleep(0.3)
        assert not done
        publish(live.manifest_dir, {**load_current(live.manifest_dir), "generation": 2})  # the build's publish
    waiting.join(timeout=10)
    assert done[0]["generation"] == 3 and done[0]["cutover"]["previous"] == 2
