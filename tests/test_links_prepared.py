"""The fast lane resolves the links while its sources' stores are written (cross_source_links.
prepare_links); the links stage takes that result only where nothing it reads changed since: the
sources' graph, reference and chunk tables and the proposals log."""
from __future__ import annotations

import json

import pytest

from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.models import DocReference
from mtrag_resources.stages import cross_source_links
from mtrag_resources.stores import tables
from tests.test_links_reads import _forget_all, _home

pytestmark = pytest.mark.unit


def _clear_memos():
    for memo in (cross_source_links._INDEX_MEMO, cross_source_links._LINKS_MADE, cross_source_links._PREPARED):
        memo.clear()


@pytest.fixture
def keeping(monkeypatch):
    """A process that keeps resolutions (the watch), with the resolutions it makes counted; the
    module's memos start and end empty (another test's index would be kept, and this one's)."""
    _clear_memos()
    monkeypatch.setattr(cross_source_links, "_KEEP_RESOLUTIONS", True)
    calls = []
    resolve_all = cross_source_links._resolve_all

    def counted(*args, **kwargs):
        calls.append(args[1])
        return resolve_all(*args, **kwargs)

    monkeypatch.setattr(cross_source_links, "_resolve_all", counted)
    yield calls
    _clear_memos()


def _triples(links):
    return [(l.src_id, l.dst_id, l.confidence) for l in links]


def test_the_links_stage_takes_the_links_prepared_from_the_same_reads(tmp_path, keeping):
    settings, specs = _home(tmp_path)
    assert cross_source_links.prepare_links(settings, specs)
    assert len(keeping) == 1
    links, stats = cross_source_links.update_links_table(settings, specs)
    assert len(keeping) == 1  # nothing resolved again
    assert _triples(links) == [("chunk:d2", "shop:shop.tax.Rate", "INFERRED"),
                               ("chunk:d1", "shop:shop.tax.apply_tax", "VERIFIED")]
    # the figures are the preparing resolution's: what this batch resolved
    assert stats["targets_resolved"] == 1 and stats["proposals_used"] == 1
    assert [r["rel_id"] for r in tables.read_rows(settings.links_table)] == [l.rel_id for l in links]
    _forget_all(settings, specs)
    fresh, _ = cross_source_links.compute_links(settings, specs)  # a process with nothing held
    assert fresh == links
    # taken once: the next stage resolves (from its memo) instead of taking it again
    cross_source_links.update_links_table(settings, specs)
    assert len(keeping) == 3


def test_a_reference_table_written_after_the_prepare_is_resolved_again(tmp_path, keeping):
    settings, specs = _home(tmp_path)
    assert cross_source_links.prepare_links(settings, specs)
    docs = SourceLayout(settings, "shop-docs")
    tables.write_rows(docs.references, [
        DocReference(chunk_id="d1", file_path="totals.md", line=4, ref_kind="backtick", role="",
                     target="shop.apply_tax", matched_text="`shop.apply_tax`", source_id="shop-docs"),
        DocReference(chunk_id="d2", file_path="totals.md", line=7, ref_kind="backtick", role="",
                     target="shop.tax.BaseRate", matched_text="`shop.tax.BaseRate`", source_id="shop-docs")],
        DocReference)
    links, stats = cross_source_links.update_links_table(settings, specs)
    assert len(keeping) == 2
    assert ("chunk:d2", "shop:shop.tax.BaseRate", "VERIFIED") in _triples(links)
    assert stats["references"] == 2


def test_a_proposal_logged_after_the_prepare_is_joined(tmp_path, keeping):
    settings, specs = _home(tmp_path)
    assert cross_source_links.prepare_links(settings, specs)
    with settings.proposals_log.open("a") as fh:  # the server logs a bridge proposal meanwhile
        fh.write(json.dumps({"node_id": "shop:shop.tax.BaseRate", "from_chunk_id": "d1", "file_path": "totals.md",
                             "line": 5, "matched_text": "base rate", "source_id": "shop-docs"}) + "\n")
    links, stats = cross_source_links.update_links_table(settings, specs)
    assert len(keeping) == 2
    assert ("chunk:d1", "shop:shop.tax.BaseRate", "INFERRED") in _triples(links)
    assert stats["proposals_used"] == 2


def test_a_one_shot_process_prepares_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(cross_source_links, "_KEEP_RESOLUTIONS", False)
    settings, specs = _home(tmp_path)
    assert not cross_source_links.prepare_links(settings, specs)
    assert len(cross_source_links._PREPARED) == 0
