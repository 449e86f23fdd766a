"""The links stage reads only what it uses of each source's tables (cross_source_links.py:
rows_where / column_values): with nothing decoded in the process (a CLI build) and with the
tables held (the watch), it makes the same links, proposals included, from bucketed tables."""
from __future__ import annotations

import json

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.models import DocReference, GraphNode, GraphRelation
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stages import cross_source_links
from mtrag_resources.stages.canonical_graph import NODE_BUCKETS, RELATION_BUCKETS
from mtrag_resources.stages.cas_chunks import CHUNK_BUCKETS
from mtrag_resources.stores import tables

pytestmark = pytest.mark.unit


def _node(sid: str, qn: str, label: str, path: str) -> GraphNode:
    return GraphNode(node_id=f"{sid}:{qn}", label=label, name=qn.rsplit(".", 1)[-1], qualified_name=qn,
                     source_id=sid, file_path=path, start_line=1, end_line=3, chunk_id=f"c-{qn}")


def _home(tmp_path) -> tuple[Settings, list[SourceSpec]]:
    settings = Settings(home=tmp_path / "home")
    code, docs = SourceSpec(id="shop", kind="code", path="."), SourceSpec(id="shop-docs", kind="docs", path=".")
    nodes = sorted([_node("shop", "shop", "Module", "shop/__init__.py"),
                    _node("shop", "shop.tax", "Module", "shop/tax.py"),
                    _node("shop", "shop.tax.apply_tax", "Function", "shop/tax.py"),
                    _node("shop", "shop.tax.Rate", "Class", "shop/tax.py"),
                    _node("shop", "shop.tax.BaseRate", "Class", "shop/tax.py")], key=lambda n: n.node_id)
    inherits = GraphRelation(rel_id="r1", rel_type="INHERITS", src_id="shop:shop.tax.Rate",
                             dst_id="shop:shop.tax.BaseRate", confidence="VERIFIED", candidates=[],
                             evidence_file="shop/tax.py", evidence_start=2, evidence_end=2, evidence_hash="h",
                             evidence_text="class Rate(BaseRate)", source_id="shop")
    layout = SourceLayout(settings, "shop")
    tables.write_rows(layout.nodes, nodes, GraphNode, NODE_BUCKETS)
    tables.write_rows(layout.relations, [inherits], GraphRelation, RELATION_BUCKETS)
    tables.write_rows(layout.references, [], DocReference)
    tables.write_rows(layout.imports, [{"module_qn": "shop", "imported": "shop.tax.apply_tax", "alias": "apply_tax"}])
    tables.write_table(layout.chunks, _chunks([("c-shop.tax.apply_tax", "shop/tax.py", "h-apply")]),
                       bucketing=CHUNK_BUCKETS)
    docs_layout = SourceLayout(settings, "shop-docs")
    tables.write_rows(docs_layout.nodes, [_node("shop-docs", "Totals", "Page", "totals.md")], GraphNode, NODE_BUCKETS)
    tables.write_rows(docs_layout.relations, [], GraphRelation, RELATION_BUCKETS)
    tables.write_rows(docs_layout.references, [DocReference(
        chunk_id="d1", file_path="totals.md", line=4, ref_kind="backtick", role="", target="shop.apply_tax",
        matched_text="`shop.apply_tax`", source_id="shop-docs")], DocReference)
    tables.write_rows(docs_layout.imports, [])
    tables.write_table(docs_layout.chunks, _chunks([("d1", "totals.md", "h-d1"), ("d2", "totals.md", "h-d2")]),
                       bucketing=CHUNK_BUCKETS)
    settings.proposals_log.parent.mkdir(parents=True, exist_ok=True)
    settings.proposals_log.write_text(json.dumps({
        "node_id": "shop:shop.tax.Rate", "from_chunk_id": "d2", "file_path": "totals.md", "line": 9,
        "matched_text": "rate", "source_id": "shop-docs"}) + "\n")
    return settings, [code, docs]


def _chunks(rows):
    import pyarrow as pa
    return pa.Table.from_pylist([{"chunk_id": c, "file_path": f, "content_hash": h, "role": "child"} for c, f, h in rows])


def _forget_all(settings, specs):
    for spec in specs:
        layout = SourceLayout(settings, spec.id)
        for path in (layout.nodes, layout.relations, layout.chunks, layout.references, layout.imports):
            tables._forget(path)
    cross_source_links._INDEX_MEMO.clear()
    cross_source_links._LINKS_MADE.clear()


def test_links_from_partial_reads_equal_links_from_held_tables(tmp_path):
    settings, specs = _home(tmp_path)
    held, held_stats = cross_source_links.compute_links(settings, specs)  # the writers' rows held
    _forget_all(settings, specs)
    fresh, fresh_stats = cross_source_links.compute_links(settings, specs)  # a CLI build's process
    assert held == fresh and held_stats == fresh_stats
    # the doc's reference resolves through the package's re-export, the logged proposal joins as an
    # INFERRED link to the node it names (read by its id alone); each with its chunk's hash
    assert [(l.src_id, l.dst_id, l.confidence, l.evidence_hash) for l in fresh] == [
        ("chunk:d2", "shop:shop.tax.Rate", "INFERRED", "h-d2"),
        ("chunk:d1", "shop:shop.tax.apply_tax", "VERIFIED", "h-d1")]
    assert fresh_stats == {"references": 1, "unresolved": 0, "proposals_used": 1, "targets_resolved": 1,
                           "targets_kept": 0, "files_resolved": 1, "links_reused": 0}
    assert tables.cached_rows(SourceLayout(settings, "shop").chunks) is None  # two columns read, not decoded
