"""Builds through real Dagster runs on a temporary instance, against the real stores."""
from __future__ import annotations

import json

import dagster as dg
import pytest

from mtrag_resources.publish.manifest import load_current
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.stores.connect import open_fts, open_neo4j, open_qdrant
from mtrag_resources.stores.tables import read_rows
from tests.build_helpers import build, latest_metadata, settings

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]


def chunk_rows(source_id: str) -> list[dict]:
    return read_rows(SourceLayout(settings(), source_id).chunks)


def store_counts(source_id: str, kind: str) -> dict:
    s = settings()
    with open_qdrant(s) as q:
        points = q.count(kind, source_id)
    fts = open_fts(s)
    neo = open_neo4j(s)
    try:
        return {"qdrant": points, "fts": fts.counts(source_id), "neo4j": neo.counts(source_id)}
    finally:
        fts.close()
        neo.close()


def test_full_build_publishes_every_store_and_rebuild_embeds_nothing(mtrag_env):
    summary = build()
    assert summary["built"] == ["shop", "shop-docs"]
    manifest = load_current(settings().manifest_dir)
    assert manifest["generation"] == 1
    assert set(manifest["sources"]) == {"shop", "shop-docs"}
    for sid, entry in manifest["sources"].items():
        assert all(v["state"] == "committed" and v["generation"] == entry["chunk_generation"]
                   for v in entry["stores"].values())
    rows = chunk_rows("shop")
    children = [r for r in rows if r["role"] == "child"]
    counts = store_counts("shop", "code")
    assert counts["qdrant"] == len(children) == counts["fts"]["child_rows"]
    assert counts["neo4j"]["chunks"] == len(rows)
    # the manifest's counts (from the chunk table's role column) are the table's
    assert manifest["sources"]["shop"]["counts"] == {
        "chunks": len(rows), "children": len(children), "parents": sum(r["role"] == "parent" for r in rows),
        "files": manifest["sources"]["shop"]["counts"]["files"],
        "multilingual": sum(r["role"] == "child" and r["script"] == "cjk" for r in rows)}  # none: an English corpus
    assert manifest["sources"]["shop"]["counts"]["parents"] > 0
    assert latest_metadata("embedding_cache", "shop")["embedded"] == len({r["content_hash"] for r in children})
    assert {"CALLS", "DEFINES", "INHERITS"} <= set(counts["neo4j"]["relationships"])

    build(force=True)
    assert latest_metadata("embedding_cache", "shop")["embedded"] == 0
    assert latest_metadata("embedding_cache", "shop-docs")["embedded"] == 0
    assert store_counts("shop", "code") == counts  # idempotent: same counts, markers committed
    manifest2 = load_current(settings().manifest_dir)
    assert manifest2["sources"]["shop"]["chunk_generation"] == manifest["sources"]["shop"]["chunk_generation"]


def test_changed_docstring_embeds_exactly_the_chunks_containing_it(mtrag_env):
    build()
    before = {r["chunk_id"]: r for r in chunk_rows("shop")}
    cart = mtrag_env["pkg"] / "cart.py"
    new_doc = "Number of priced items currently in the cart."
    cart.write_text(cart.read_text().replace("Number of items in the cart.", new_doc))
    build()
    after = {r["chunk_id"]: r for r in chunk_rows("shop")}
    assert set(after) == set(before), "editing a docstring must not change any chunk id"
    changed_children = [cid for cid, r in after.items()
                        if r["role"] == "child" and r["content_hash"] != before[cid]["content_hash"]]
    assert len(changed_children) >= 1
    assert latest_metadata("embedding_cache", "shop")["embedded"] == len(changed_children)
    assert all(after[c]["symbol"].startswith("shopcart.cart.BaseCart") for c in changed_children)


def test_inserted_function_shifts_no_chunk_id(mtrag_env):
    build()
    before = {r["chunk_id"]: r for r in chunk_rows("shop")}
    tax = mtrag_env["pkg"] / "tax.py"
    text = tax.read_text().replace(
        "def apply_tax", 'def format_rate(rate: float) -> str:\n    """Format a rate as a percentage."""\n'
        '    return f"{rate:.0%}"\n\n\ndef apply_tax')
    tax.write_text(text)
    build()
    after = {r["chunk_id"]: r for r in chunk_rows("shop")}
    assert set(before) < set(after)
    added = [after[c] for c in set(after) - set(before)]
    assert [r["symbol"] for r in added] == ["shopcart.tax.format_rate"]
    moved = after[next(c for c, r in after.items() if r["symbol"] == "shopcart.tax.apply_tax")]
    assert moved["start_line"] > before[moved["chunk_id"]]["start_line"]
    assert latest_metadata("embedding_cache", "shop")["embedded"] == 1


def test_deleted_file_and_renamed_function_leave_every_store(mtrag_env):
    build()
    (mtrag_env["docs"] / "notes.md").unlink()
    cart = mtrag_env["pkg"] / "cart.py"
    cart.write_text(cart.read_text().replace("def add(", "def add_item("))
    build()
    s = settings()
    fts = open_fts(s)
    neo = open_neo4j(s)
    try:
        assert not fts.exact("notes.md") and not fts.exact("shopcart.cart.Cart.add")
        assert fts.exact("shopcart.cart.Cart.add_item")
        assert not neo.resolve_anchors(["shopcart.cart.Cart.add"])
        assert neo.resolve_anchors(["shopcart.cart.Cart.add_item"])
        assert neo.counts("shop-docs")["chunks"] == len(chunk_rows("shop-docs"))
    finally:
        fts.close()
        neo.close()
    with open_qdrant(s) as q:
        docs_paths = {h["payload"]["file_path"] for h in q.search("docs", [0.1] * 384, k=50)}
        assert docs_paths == {"guide.md"}
        assert q.count("code", "shop") == sum(r["role"] == "child" for r in chunk_rows("shop"))


def test_removed_source_loses_partition_and_published_rows(mtrag_env, tmp_path):
    build()
    mtrag_env["sources"].write_text(
        'sources:\n  - {id: shop, kind: code, path: shop, include: ["src/**/*.py"]}\n')
    summary = build()
    assert summary["removed"] == ["shop-docs"]
    assert dg.DagsterInstance.get().get_dynamic_partitions("sources") == ["shop"]
    manifest = load_current(settings().manifest_dir)
    assert manifest["generation"] == 2 and list(manifest["sources"]) == ["shop"]
    counts = store_counts("shop-docs", "docs")
    assert counts["qdrant"] == 0 and counts["fts"]["child_rows"] == 0 and counts["neo4j"]["chunks"] == 0
    # the Qdrant version the manifest names was made after the removed source's points went
    from mtrag_resources.stores.qdrant_folder import link_for_reader
    from mtrag_resources.stores.qdrant_store import QdrantStore
    link_for_reader(manifest["stores"]["qdrant_snapshot"], tmp_path / "published")
    with QdrantStore(path=tmp_path / "published", lock_timeout=1) as published:
        assert published.count("docs", "shop-docs") == 0 and published.count("code", "shop") > 0


def test_bad_inputs_are_skipped_with_reasons_and_the_build_goes_on(mtrag_env, tmp_path):
    pkg = mtrag_env["pkg"]
    (pkg / "blob.py").write_bytes(b"\x00\x01binary")
    (pkg / "huge.py").write_text("x = 1\n" * 400_000)  # 2.4 MB > the 2 MB default
    (pkg / "latin1.py").write_bytes('"""caf\xe9"""\ndef f():\n    return 1\n'.encode("latin-1"))
    (pkg / "broken.py").write_text("def broken(:\n    pass\n")
    (pkg / "empty.py").write_text("")
    outside = tmp_path / "outside.py"
    outside.write_text("SECRET = 1\n")
    (pkg / "escape.py").symlink_to(outside)
    (pkg / "loop").symlink_to(pkg, target_is_directory=True)
    build()
    raw = latest_metadata("raw_source", "shop")
    reasons = raw["skipped_reasons"]
    assert "binary" in reasons["src/shopcart/blob.py"]
    assert "max_file_bytes" in reasons["src/shopcart/huge.py"]
    assert "leaves the source root" in reasons["src/shopcart/escape.py"]
    assert "not followed" in reasons["src/shopcart/loop"]
    assert "invalid UTF-8" in raw["warnings"]["src/shopcart/latin1.py"]
    chunks = latest_metadata("cas_chunks", "shop")
    assert any("broken.py" in w for w in chunks["warnings"])
    rows = chunk_rows("shop")
    assert any(r["file_path"] == "src/shopcart/broken.py" and r["chunk_type"] == "window" for r in rows)
    assert not any(r["file_path"] == "src/shopcart/escape.py" for r in rows)
    assert load_current(settings().manifest_dir)["generation"] == 1


def test_cross_source_links_resolve_through_inheritance(mtrag_env):
    build()
    links = read_rows(settings().links_dir / "links.parquet")
    by_target = {(l["rel_type"], l["dst_id"]): l for l in links}
    inherited = by_target.get(("MENTIONS", "shop:method:shopcart.cart.BaseCart.item_count"))
    assert inherited and inherited["confidence"] == "VERIFIED"
    assert ("IMPLEMENTS", "shop:class:shopcart.cart.Cart") in by_target
    assert by_target[("MENTIONS", "shop:function:shopcart.tax.apply_tax")]["evidence_text"].startswith(":func:")


def test_links_follow_the_same_re_exports_from_the_imports_table_as_from_the_files_facts(mtrag_env):
    """cross_source_links reads canonical_graph's imports table instead of decoding every file's
    facts in a new process; a graph written before that table falls back to the facts."""
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.stages.cross_source_links import build_index

    build()
    s = settings()
    specs = load_sources(s.sources_file)
    from_tables, _ = build_index(s, specs)
    assert from_tables.exports  # the sample package re-exports names (`from .cart import Cart`)
    for spec in specs:
        SourceLayout(s, spec.id).imports.unlink()
    from_facts, _ = build_index(s, specs)
    assert from_tables.exports == from_facts.exports


def test_links_reuse_the_symbol_index_while_the_code_side_is_unchanged(mtrag_env):
    """In one process (a watch, here the in-process builds) a docs-only change reuses the symbol
    index and its resolutions; a code change builds it again; either way the links are those of a
    fresh computation."""
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.stages import cross_source_links as csl

    def fresh_links() -> list[str]:
        csl._INDEX_MEMO.clear()
        links, _ = csl.compute_links(s, load_sources(s.sources_file))
        return [link.rel_id for link in links]

    build()
    s = settings()
    index = csl._INDEX_MEMO["last"][1]
    before = len(read_rows(s.links_table))
    (mtrag_env["docs"] / "coupons.md").write_text("# Coupons\n\nApplied before :func:`shopcart.tax.apply_tax`.\n")
    build()
    assert csl._INDEX_MEMO["last"][1] is index  # the docs changed, the code's entities did not
    assert len(read_rows(s.links_table)) == before + 1
    # the run's links stage resolved the new file's references alone and kept every other link
    # (stages/links_state.py), as a fresh `mtrag build` process does
    meta = latest_metadata("cross_source_links")
    assert (meta["files_resolved"], meta["links_reused"]) == (1, before)
    assert [r["rel_id"] for r in read_rows(s.links_table)] == fresh_links()
    index = csl._INDEX_MEMO["last"][1]
    tax = mtrag_env["pkg"] / "tax.py"
    tax.write_text(tax.read_text() + '\n\ndef tax_free(amount: float) -> float:\n    """No tax."""\n    return amount\n')
    (mtrag_env["docs"] / "coupons.md").write_text("# Coupons\n\nSee :func:`shopcart.tax.tax_free`.\n")
    build()
    assert csl._INDEX_MEMO["last"][1] is not index  # a new function: a new index, which resolves it
    assert latest_metadata("cross_source_links")["links_reused"] == 0  # every reference resolved again
    links = read_rows(s.links_table)
    assert any(r["dst_id"].endswith("tax_free") for r in links)
    assert [r["rel_id"] for r in links] == fresh_links()
