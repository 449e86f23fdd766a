"""What a long-lived process remembers between batches answers as a fresh read of the files would:
the highest manifest number, and the bridge proposals log."""
from __future__ import annotations

import json

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import manifest_path
from mtrag_resources.publish.manifest import latest_number
from mtrag_resources.stages.cross_source_links import _read_proposals

pytestmark = pytest.mark.unit


def test_the_latest_manifest_number_follows_new_and_removed_manifests(tmp_path):
    assert latest_number(tmp_path) == 0
    for n in (1, 2, 3):
        manifest_path(tmp_path, n).write_text("{}")
    assert latest_number(tmp_path) == 3
    manifest_path(tmp_path, 4).write_text("{}")  # another process published
    assert latest_number(tmp_path) == 4
    manifest_path(tmp_path, 4).unlink()  # the remembered one is gone: the folder is listed again
    manifest_path(tmp_path, 3).unlink()
    assert latest_number(tmp_path) == 2
    other = tmp_path / "other"
    other.mkdir()
    assert latest_number(other) == 0  # one answer per folder


def test_the_proposals_log_is_read_again_when_it_changed(tmp_path):
    settings = Settings(home=tmp_path)
    log = settings.proposals_log
    assert _read_proposals(settings) == []
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(json.dumps({"node_id": "a"}) + "\n" + json.dumps({"node_id": "b"}) + "\n")
    assert [p["node_id"] for p in _read_proposals(settings)] == ["a", "b"]
    with open(log, "a") as fh:  # a reader appended one
        fh.write(json.dumps({"node_id": "c"}) + "\n" + '{"node_id": "torn')
    assert [p["node_id"] for p in _read_proposals(settings)] == ["a", "b", "c"]
    log.write_text(json.dumps({"node_id": "z"}) + "\n")  # replaced
    assert [p["node_id"] for p in _read_proposals(settings)] == ["z"]
