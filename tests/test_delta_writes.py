"""A build after a small change writes Qdrant, FTS and Neo4j by difference against the tables the stores
last committed (stores/table_delta.py), and what it leaves is exactly what a full write leaves:
the same chunk rows, aliases and FTS matches (compared with a full write into a fresh database),
and points and a graph in which a full write finds nothing to change. A store that did not finish its last
write gets the full write again. Real Dagster runs, a real Neo4j server, real SQLite."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mtrag_resources.core.layout import SourceLayout, read_state
from mtrag_resources.core.models import GraphNode, GraphRelation
from mtrag_resources.stages import fts_db
from mtrag_resources.stages.neo4j_graph import CHUNK_NODE_FIELDS
from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.stores.connect import open_fts, open_neo4j
from mtrag_resources.stores.fts_store import FtsStore
from mtrag_resources.stores.tables import read_rows
from tests.build_helpers import build, latest_metadata, settings

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))
CHUNK_COLS = ("chunk_id, source_kind, role, chunk_type, parent_id, file_path, start_line, end_line, symbol, "
              "title, summary, text, language, content_hash, locator, graph_ids, extra")


def _change_corpus(env: dict) -> None:
    """An append, a new file, a rename and a deletion, in code and docs (CJK included)."""
    tax = env["pkg"] / "tax.py"
    tax.write_text(tax.read_text() + '\n\ndef tax_free(amount: float) -> float:\n'
                   '    """No tax: the amount as it is."""\n    return apply_tax(amount, "none") - amount + amount\n')
    (env["pkg"] / "rates.py").rename(env["pkg"] / "rate_table.py")
    (env["pkg"] / "coupons.py").write_text('"""Coupons."""\n\n\ndef coupon_value(code: str) -> float:\n'
                                           '    """The value of a coupon code."""\n    return 5.0 if code else 0.0\n')
    (env["docs"] / "notes.md").unlink()
    (env["docs"] / "faq.md").write_text("# 常见问题\n\n## 退货\n\n退货需要在三十天内完成，运费由买家承担。\n")


def _fts_content(path: Path, source_id: str) -> tuple[set, set, dict]:
    conn = sqlite3.connect(path)
    try:
        rows = set(conn.execute(f"SELECT {CHUNK_COLS} FROM chunks WHERE source_id = ?", (source_id,)))
        aliases = set(conn.execute("SELECT alias_norm, alias, alias_kind, chunk_id FROM exact_aliases "
                                   "WHERE source_id = ?", (source_id,)))
        matches = {}
        for table, query in (("fts_trigram", '"tax"'), ("fts_trigram", '"coupon"'), ("fts_cjk", "退货"),
                             ("fts_cjk", "amount")):
            matches[(table, query)] = {r[0] for r in conn.execute(
                f"SELECT c.chunk_id FROM {table} f JOIN chunks c ON c.rid = f.rowid "
                f"WHERE {table} MATCH ? AND c.source_id = ?", (query, source_id))}
        return rows, aliases, matches
    finally:
        conn.close()


def _full_fts_write(s, source_id: str, path: Path) -> None:
    """What the full write would store for the source's current chunk table, in a fresh database."""
    layout = SourceLayout(s, source_id)
    rows = read_rows(layout.chunks)
    cas = ContentStore(s.cas_dir)
    for r in rows:
        r["text"] = cas.get_text(r["content_hash"])
    ids = {r["chunk_id"] for r in rows}
    endpoints = [a for a in fts_db._endpoint_aliases(layout) if a[2] in ids]
    store = FtsStore(path)
    try:
        store.write_source(source_id, "full", "full", rows,
                           fts_db._with_endpoints(rows, source_id, endpoints) if endpoints else None)
    finally:
        store.close()


def _full_neo4j_write(s, source_id: str) -> dict:
    layout = SourceLayout(s, source_id)
    store = open_neo4j(s)
    try:
        counts = store.counts(source_id)
        assert counts["chunks"] == store.chunk_count(source_id) > 0  # the gate's one-query count
        return store.write_source(source_id, read_state(layout)["generation"], read_rows(layout.nodes, GraphNode),
                                  read_rows(layout.relations, GraphRelation),
                                  [{k: c[k] for k in CHUNK_NODE_FIELDS} for c in read_rows(layout.chunks)])
    finally:
        store.close()


def _full_qdrant_write(s, source_id: str) -> dict:
    """The full write of the source's points (it compares every point's digest with the stored one)."""
    from mtrag_assets.resources import MtragResource
    from mtrag_resources.core.models import cjk_children
    from mtrag_resources.embedding.multilingual import collection_kind
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.stages import qdrant_collection as qc
    from mtrag_resources.stores.connect import open_qdrant
    from mtrag_resources.stores.embedding_cache import EmbeddingCache

    spec = next(x for x in load_sources(s.sources_file) if x.id == source_id)
    layout, resource = SourceLayout(s, source_id), MtragResource()
    rows = qc.child_rows(layout)
    ml = resource.multilingual()
    ml_rows = cjk_children(rows)
    extra = {collection_kind(spec.kind): qc._points(ml.fingerprint_id, ml_rows, key=qc._content_hash) if ml_rows else []}
    with open_qdrant(s) as store:
        return store.write_source(source_id, spec.kind, read_state(layout)["generation"],
                                  qc._points(resource.embedder().fingerprint_id, rows), extra=extra,
                                  resolve_vectors=qc._resolver(EmbeddingCache(s.embeddings_dir), source_id))


def _assert_same_as_full(s, tmp_path: Path, source_id: str) -> None:
    fresh = tmp_path / f"full-{source_id}.sqlite"
    _full_fts_write(s, source_id, fresh)
    got, want = _fts_content(s.fts_path, source_id), _fts_content(fresh, source_id)
    assert got[0] == want[0], "chunk rows differ from a full write"
    assert got[1] == want[1], (sorted(got[1] - want[1])[:5], sorted(want[1] - got[1])[:5])
    assert got[2] == want[2]
    again = _full_neo4j_write(s, source_id)  # the full diff against Neo4j: nothing left to do
    assert (again["written_nodes"], again["written_relationships"], again["deleted_nodes"],
            again["deleted_relationships"]) == (0, 0, 0, 0), again
    points = _full_qdrant_write(s, source_id)  # every stored point's digest is the full write's
    assert (points["upserted"], points["deleted"]) == (0, 0), points
    assert all(v == 0 for k, v in points.items() if k.endswith("_upserted")), points


def test_a_small_change_is_written_by_difference_and_equals_a_full_write(mtrag_env, tmp_path):
    build()
    assert latest_metadata("neo4j_graph", "shop")["write"] == "full"  # nothing projected before
    assert latest_metadata("fts_db", "shop-docs")["write"] == "full"
    _change_corpus(mtrag_env)
    result = build()
    assert sorted(result["built"]) == ["shop", "shop-docs"]
    s = settings()
    for sid in ("shop", "shop-docs"):
        neo, fts, qd = (latest_metadata(a, sid) for a in ("neo4j_graph", "fts_db", "qdrant_collection"))
        assert neo["write"] == fts["write"] == qd["write"] == "delta", (sid, neo, fts, qd)
        # the difference came from cas_chunks' change log, not from comparing the chunk tables
        assert latest_metadata("cas_chunks", sid)["change_log"].endswith("removed"), sid
        assert fts["delta_read"] == qd["delta_read"] == "log", (fts, qd)
        # ... and the graph's from canonical_graph's (this process wrote the graph tables before)
        assert neo["delta_read"] == "nodes:log chunks:log relations:log", neo
        assert qd["upserted"] < qd["points"]
        assert fts["deleted_rows"] < fts["child_rows"] + fts["parent_rows"]  # not the whole source
        _assert_same_as_full(s, tmp_path, sid)
    neo = latest_metadata("neo4j_graph", "shop")
    assert 0 < neo["written_nodes"] < neo["total_nodes"] and neo["written_relationships"] < neo["total_relationships"]
    fts = open_fts(s)
    try:
        hit = fts.exact("shopcart.coupons.coupon_value")[0]
        assert fts.get_chunks([hit["chunk_id"]])[hit["chunk_id"]]["file_path"] == "src/shopcart/coupons.py"
        assert fts.exact("src/shopcart/rate_table.py") and not fts.exact("src/shopcart/rates.py")
        assert not fts.exact("notes.md") and fts.exact("faq.md")
        found = fts.get_chunks([h["chunk_id"] for h in fts.search("退货运费", k=10)])
        assert any(c["file_path"] == "faq.md" for c in found.values())
    finally:
        fts.close()


def test_a_store_left_mid_write_gets_the_full_write_again(mtrag_env, tmp_path):
    """Killed after the FTS `begin` marker of a delta write: the next build does not trust the
    snapshot (the store no longer holds its generation) and converges through the full write."""
    build()
    _change_corpus(mtrag_env)
    env = {k: v for k, v in os.environ.items() if k not in ("MTRAG_FAULT_SIGNAL",)}
    env["MTRAG_FAULT"] = "fts:after_begin"
    out = subprocess.run([MTRAG, "build", "--source", "shop"], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == -signal.SIGKILL, (out.returncode, out.stderr[-3000:])
    s = settings()
    fts = open_fts(s)
    try:
        assert fts.marker("shop").state == "begin"
    finally:
        fts.close()
    build()
    assert latest_metadata("fts_db", "shop")["write"] == "full"
    assert latest_metadata("fts_db", "shop-docs")["write"] == "delta"
    for sid in ("shop", "shop-docs"):
        _assert_same_as_full(s, tmp_path, sid)


def _full_links_write(s) -> dict:
    """The full write of the links table (it reads and compares every link Neo4j holds)."""
    from mtrag_resources.stores.contract import LINKS_SOURCE
    links = read_rows(s.links_table, GraphRelation)
    store = open_neo4j(s)
    try:
        stats = store.write_links(store.marker(LINKS_SOURCE).generation, links)
        stats["held"] = store.relationship_counts(LINKS_SOURCE)
    finally:
        store.close()
    stats["want"] = {t: sum(link.rel_type == t for link in links) for t in {link.rel_type for link in links}}
    return stats


def test_links_are_written_by_difference_and_equal_a_full_write(mtrag_env):
    build()
    first = latest_metadata("cross_source_links")
    assert first["write"] == "full"  # nothing projected before
    mention = mtrag_env["docs"] / "coupons.md"
    mention.write_text("# Coupons\n\nA coupon lowers the total before :func:`shopcart.tax.apply_tax` runs.\n")
    build()
    added = latest_metadata("cross_source_links")
    assert added["write"] == "delta" and added["links"] > first["links"]
    mention.unlink()
    build()
    removed = latest_metadata("cross_source_links")
    assert removed["write"] == "delta" and removed["links"] == first["links"]
    build(force=True)  # the same links: nothing to write, the counts are checked
    assert latest_metadata("cross_source_links")["write"] == "delta"
    again = _full_links_write(settings())
    assert (again["written_relationships"], again["deleted_relationships"]) == (0, 0), again
    assert not again["skipped_relationships"] and again["held"] == again["want"]
