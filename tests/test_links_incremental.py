"""A one-shot links stage resolves only the docs files that changed (stages/links_state.py): after
each change the links table and the stage's figures equal a resolution of every reference from
scratch, bridge proposals included; a change to a source that feeds the symbol index, a links
table the state does not describe, or a torn state resolves everything again."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.models import GraphNode
from mtrag_resources.ingest.sources import load_sources
from mtrag_resources.stages import cross_source_links as csl
from mtrag_resources.stages.canonical_graph import build_canonical_graph
from mtrag_resources.stages.cas_chunks import build_cas_chunks
from mtrag_resources.stages.raw_source import build_raw_source
from mtrag_resources.stores import tables
from tests.corpus import write_corpus

pytestmark = pytest.mark.unit

API_MD = """# API

:func:`shopcart.tax.lookup_rate` reads the table; see :func:`shopcart.tax.apply_tax` and :meth:`Cart.add`.
"""
FAQ_MD = """# FAQ

## Rounding

:func:`shopcart.tax.apply_tax` rounds to cents. :data:`shopcart.rates.RATES` holds them. :func:`no.such.name` stays unresolved.
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setattr(csl, "_KEEP_RESOLUTIONS", False)  # a one-shot process, whatever ran before
    paths = write_corpus(tmp_path / "corpus")
    (paths["docs"] / "api.md").write_text(API_MD)
    (paths["docs"] / "faq.md").write_text(FAQ_MD)
    settings = Settings(home=tmp_path / "home", sources=paths["sources"]).ensure()
    specs = load_sources(settings.sources_file)
    _build(settings, specs)
    return settings, specs, paths


def _build(settings, specs, only: str | None = None) -> None:
    for spec in specs:
        if only is None or spec.id == only:
            build_raw_source(settings, spec)
            build_cas_chunks(settings, spec)
            build_canonical_graph(settings, spec)


def _fresh_process(settings, specs) -> None:
    """What a new process holds of the links: nothing (the tables are read from disk again)."""
    for spec in specs:
        layout = SourceLayout(settings, spec.id)
        for path in (layout.nodes, layout.relations, layout.chunks, layout.references, layout.imports):
            tables._forget(path)
    tables._forget(settings.links_table)
    csl._INDEX_MEMO.clear()
    csl._LINKS_MADE.clear()


def _stage(settings, specs) -> tuple[list[dict], dict]:
    _fresh_process(settings, specs)
    links, stats = csl.update_links_table(settings, specs)
    return [asdict(l) for l in links], stats


def _from_scratch(settings, specs) -> tuple[list[dict], dict]:
    _fresh_process(settings, specs)
    links, stats = csl.compute_links(settings, specs)
    return [asdict(l) for l in links], stats


def _table(settings) -> list[dict]:
    tables._forget(settings.links_table)
    return tables.read_rows(settings.links_table)


SAME = ("references", "unresolved", "proposals_used")


def _assert_same(settings, specs, links, stats) -> None:
    want, want_stats = _from_scratch(settings, specs)
    assert links == want
    assert [{k: r[k] for k in want[0]} for r in _table(settings)] == want
    assert {k: stats[k] for k in SAME} == {k: want_stats[k] for k in SAME}


def _propose(settings, from_file: str, node_qn: str) -> None:
    """A bridge proposal from the first child chunk of a docs file to a code entity."""
    chunks = tables.read_rows(SourceLayout(settings, "shop-docs").chunks)
    chunk = next(c for c in chunks if c["file_path"] == from_file and c["role"] == "child")
    node = next(n for n in tables.read_rows(SourceLayout(settings, "shop").nodes, GraphNode) if n.qualified_name == node_qn)
    settings.proposals_log.parent.mkdir(parents=True, exist_ok=True)
    with settings.proposals_log.open("a") as fh:
        fh.write(json.dumps({"node_id": node.node_id, "from_chunk_id": chunk["chunk_id"], "file_path": from_file,
                             "line": 3, "matched_text": "rounds", "source_id": "shop-docs"}) + "\n")


def test_docs_changes_resolve_the_changed_files_and_give_the_links_of_a_full_resolution(home):
    settings, specs, paths = home
    _propose(settings, "notes.md", "shopcart.cart.Cart")
    links, stats = _stage(settings, specs)  # no state yet: everything resolved, the state written
    assert stats["links_reused"] == 0 and stats["files_resolved"] == 3 and stats["proposals_used"] == 1
    _assert_same(settings, specs, links, stats)
    docs = paths["docs"]
    edits = [
        ("a file deleted", lambda: (docs / "api.md").unlink(), 0),
        ("a file edited (a reference added)", lambda: (docs / "faq.md").write_text(FAQ_MD + "\nAlso :meth:`Cart.total`.\n"), 1),
        ("a file added", lambda: (docs / "more.md").write_text("# More\n\nUse :func:`shopcart.tax.lookup_rate`.\n"), 1),
        ("the proposal's file edited", lambda: (docs / "notes.md").write_text("# Notes\n\nRounding happens to whole cents.\n"), 0),
        ("nothing changed", lambda: None, 0),
    ]
    for what, edit, resolved_files in edits:
        edit()
        _build(settings, specs, only="shop-docs")
        links, stats = _stage(settings, specs)
        assert stats["files_resolved"] == resolved_files, what
        assert stats["links_reused"] > 0, what  # the other files' links kept, not resolved again
        _assert_same(settings, specs, links, stats)
    assert stats["proposals_used"] == 1  # the proposal's link follows its chunk's new content


def test_a_change_to_the_code_resolves_every_reference_again(home):
    settings, specs, paths = home
    _stage(settings, specs)
    (paths["pkg"] / "tax.py").write_text((paths["pkg"] / "tax.py").read_text() + "\n\ndef lookup_rate_v2():\n    return 1\n")
    _build(settings, specs, only="shop")
    links, stats = _stage(settings, specs)
    assert stats["links_reused"] == 0 and stats["files_resolved"] == 3  # the docs files with references
    _assert_same(settings, specs, links, stats)


def test_a_links_table_or_state_the_stage_did_not_write_is_not_reused(home):
    settings, specs, paths = home
    _stage(settings, specs)
    kept = tables.read_rows(settings.links_table)
    tables.write_rows(settings.links_table, kept[:1])  # another writer's table: the state does not describe it
    (paths["docs"] / "notes.md").write_text("# Notes\n\nChanged.\n")
    _build(settings, specs, only="shop-docs")
    links, stats = _stage(settings, specs)
    assert stats["links_reused"] == 0
    _assert_same(settings, specs, links, stats)
    settings.links_state.write_text('{"index_key": ')  # torn
    links, stats = _stage(settings, specs)
    assert stats["links_reused"] == 0
    _assert_same(settings, specs, links, stats)
    links, stats = _stage(settings, specs)  # the full resolution wrote a state again
    assert stats["links_reused"] == len(links)
