"""The table diff and the projected-table snapshots behind the stores' delta writes."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.stores.table_delta import ProjectedTables, diff_tables, same_columns
from mtrag_resources.stores.tables import write_table

pytestmark = pytest.mark.unit


def _table(path, rows):
    write_table(path, pa.Table.from_pylist(rows))
    return path


def test_diff_finds_new_changed_and_removed_rows_including_lists_and_nulls(tmp_path):
    old = _table(tmp_path / "old.parquet", [
        {"id": "a", "v": 1, "tags": ["x"], "note": None},
        {"id": "b", "v": 2, "tags": [], "note": "n"},
        {"id": "c", "v": 3, "tags": ["y", "z"], "note": None}])
    new = _table(tmp_path / "new.parquet", [
        {"id": "a", "v": 1, "tags": ["x"], "note": None},      # same, nulls included
        {"id": "c", "v": 3, "tags": ["z", "y"], "note": None},  # list order is content
        {"id": "d", "v": 4, "tags": [], "note": None}])
    delta = diff_tables(new, old, key=("id",))
    assert sorted(r["id"] for r in delta.changed.to_pylist()) == ["c", "d"]
    assert delta.removed == [("b",)]
    only_v = diff_tables(new, old, key=("id",), columns=("id", "v"))
    assert [r["id"] for r in only_v.changed.to_pylist()] == ["d"]
    assert same_columns(new, old)


_ROW = st.fixed_dictionaries({
    "id": st.sampled_from("abcdefgh"), "v": st.integers(0, 3) | st.none(),
    "tags": st.lists(st.sampled_from(["x", "y", ""]), max_size=2), "note": st.sampled_from(["", "n", "é"]) | st.none()})
_ROWS = st.lists(_ROW, max_size=8, unique_by=lambda r: r["id"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old_rows=_ROWS, new_rows=_ROWS)
def test_the_hashed_diff_agrees_with_comparing_every_value(tmp_path, old_rows, new_rows):
    """The diff compares hashes of the rows' values (table_delta.diff_tables): on keyed rows it
    finds exactly what a comparison of every value finds."""
    schema = pa.schema([("id", pa.string()), ("v", pa.int64()), ("tags", pa.list_(pa.string())), ("note", pa.string())])
    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    write_table(old, pa.Table.from_pylist(old_rows, schema=schema))
    write_table(new, pa.Table.from_pylist(new_rows, schema=schema))
    delta = diff_tables(new, old, key=("id",))
    before = {r["id"]: r for r in old_rows}
    assert sorted(delta.changed.to_pylist(), key=lambda r: r["id"]) == \
        sorted((r for r in new_rows if before.get(r["id"]) != r), key=lambda r: r["id"])
    assert delta.changed.schema.names == ["id", "v", "tags", "note"]
    assert sorted(delta.removed) == sorted((k,) for k in before.keys() - {r["id"] for r in new_rows})


def test_column_names_are_checked_before_they_reach_sql(tmp_path):
    path = _table(tmp_path / "t.parquet", [{"id": "a"}])
    with pytest.raises(ValueError, match="not a column name"):
        diff_tables(path, path, key=('id" FROM x; --',))


def test_a_snapshot_keeps_the_version_it_linked_and_a_torn_save_leaves_none(tmp_path):
    table = _table(tmp_path / "chunks.parquet", [{"id": "a", "v": 1}])
    snap = ProjectedTables(tmp_path / "projected" / "fts")
    assert snap.load() is None
    snap.save("g1", {"chunks": table}, extra={"input": "x"})
    _table(table, [{"id": "a", "v": 2}])  # the stage's next table replaces the file
    last = snap.load()
    assert (last.generation, last.extra) == ("g1", {"input": "x"})
    assert pq.read_table(last.tables["chunks"]).to_pylist() == [{"id": "a", "v": 1}]
    (last.tables["chunks"]).unlink()  # a snapshot missing a table is no snapshot
    assert snap.load() is None
    snap.save("g2", {"chunks": table})
    (snap.folder / "state.json").unlink()  # as a crash between the links and the state file leaves it
    assert snap.load() is None


def test_two_sources_with_the_same_files_keep_their_own_graph_facts(tmp_path):
    """The facts memo is per source: identical files in two sources share a facts key, but each
    source's facts name its own nodes (their ids carry the source id)."""
    import shutil

    from mtrag_resources.core.config import Settings
    from mtrag_resources.core.layout import SourceLayout
    from mtrag_resources.core.models import GraphNode, GraphRelation
    from mtrag_resources.ingest import code_graph
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.stages.canonical_graph import build_canonical_graph
    from mtrag_resources.stages.cas_chunks import build_cas_chunks
    from mtrag_resources.stages.raw_source import build_raw_source
    from mtrag_resources.stores.tables import read_rows
    from tests.corpus import write_corpus

    paths = write_corpus(tmp_path / "corpus")
    shutil.copytree(paths["root"] / "shop", paths["root"] / "shop-fork")
    paths["sources"].write_text(
        "sources:\n"
        "  - {id: shop, kind: code, path: shop, include: [\"src/**/*.py\"]}\n"
        "  - {id: shop-fork, kind: code, path: shop-fork, include: [\"src/**/*.py\"]}\n")
    settings = Settings(home=tmp_path / "home", sources=paths["sources"]).ensure()
    for spec in load_sources(settings.sources_file):  # one process, as a build's stages run
        build_raw_source(settings, spec)
        build_cas_chunks(settings, spec)
        build_canonical_graph(settings, spec)
    for sid in ("shop", "shop-fork"):
        nodes = read_rows(SourceLayout(settings, sid).nodes, GraphNode)
        assert nodes and all(n.node_id.startswith(f"{sid}:") for n in nodes), sid


def test_shared_reads_follow_every_write_and_copies_stay_private(tmp_path):
    """read_shared gives one list per file version to every reader (the writer's own instances
    after write_rows); a new write is seen at once; read_rows' rows stay the caller's own."""
    from mtrag_resources.core.models import GraphNode
    from mtrag_resources.stores.tables import read_rows, read_shared, write_rows

    path = tmp_path / "nodes.parquet"
    written = [GraphNode(node_id="s:a", label="Function", name="a", qualified_name="m.a", source_id="s")]
    write_rows(path, written, GraphNode)
    shared = read_shared(path, GraphNode)
    assert shared[0] is written[0] and read_shared(path, GraphNode) is shared
    assert read_shared(path)[0]["node_id"] == "s:a"
    mine = read_rows(path, GraphNode)
    mine[0].name = "changed by a caller"
    assert read_shared(path, GraphNode)[0].name == "a" and read_rows(path)[0]["name"] == "a"

    write_rows(path, [GraphNode(node_id="s:b", label="Class", name="b", qualified_name="m.b", source_id="s")], GraphNode)
    assert [n.node_id for n in read_shared(path, GraphNode)] == ["s:b"]
    assert [r["node_id"] for r in read_shared(path)] == ["s:b"]

    write_table(path, pa.Table.from_pylist([{"node_id": "s:c", "label": "Module", "name": "c",
                                             "qualified_name": "c", "source_id": "s"}]))
    assert [n.node_id for n in read_shared(path, GraphNode)] == ["s:c"]  # built from the file's records
    assert read_shared(tmp_path / "missing.parquet", GraphNode) == []


def test_warming_loads_the_memos_the_first_batch_reads(tmp_path):
    """stages/warm.py: after it, the graph stage's facts and the tables are served from memory."""
    from mtrag_resources.core.config import Settings
    from mtrag_resources.core.layout import SourceLayout
    from mtrag_resources.core.models import GraphNode, GraphRelation
    from mtrag_resources.ingest import code_graph
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.stages import cas_chunks, common
    from mtrag_resources.stages.canonical_graph import build_canonical_graph
    from mtrag_resources.stages.raw_source import build_raw_source
    from mtrag_resources.stages.warm import warm_stage_memos
    from mtrag_resources.stores import tables
    from tests.corpus import write_corpus

    paths = write_corpus(tmp_path / "corpus")
    paths["sources"].write_text("sources:\n  - {id: shop, kind: code, path: shop, include: [\"src/**/*.py\"]}\n")
    settings = Settings(home=tmp_path / "home", sources=paths["sources"]).ensure()
    spec = load_sources(settings.sources_file)[0]
    build_raw_source(settings, spec)
    cas_chunks.build_cas_chunks(settings, spec)
    build_canonical_graph(settings, spec)
    cas_chunks._PARSED.clear()
    cas_chunks._FACTS.clear()
    tables._DECODED.clear()  # as a process that starts after the build

    code_graph._LAST_EDGES.clear()
    code_graph._LAST_IDS.clear()
    tables._ARROW.clear()
    assert warm_stage_memos(settings, ["shop", "not-built-yet"], [spec]) > 0
    warmed_facts, warmed_tables = len(cas_chunks._PARSED), len(tables._DECODED)
    assert warmed_facts > 0 and warmed_tables >= 4  # chunk records; nodes, relations, references
    layout = SourceLayout(settings, "shop")
    # the code graph's last resolution (its edges and their ids) and the graph tables' Arrow form
    assert code_graph._LAST_EDGES["shop"] and code_graph._LAST_IDS["shop"]
    assert {str(layout.nodes.resolve()), str(layout.relations.resolve())} <= set(tables._ARROW)
    # the chunk table held as the file gives it, each chunk row's line of the generation's digest kept
    assert str(layout.chunks.resolve()) in tables._ARROW
    assert len(common._ROW_LINES["shop"]) == len(tables.read_shared(layout.chunks))
    # ... which the next build finds as they were: every edge reused, the table merged, not rewritten whole
    edges_before = dict(code_graph._LAST_EDGES["shop"])
    rows_before = tables.read_shared(layout.relations, GraphRelation)
    build_canonical_graph(settings, spec)
    assert all(code_graph._LAST_EDGES["shop"][k][3] is v[3] for k, v in edges_before.items())
    # the tables' shared rows were the objects this assembly makes again: every unchanged row is
    # found by identity, none compared field by field as an equal copy ("renewed") but the Source
    # node, which each assembly makes anew
    renewed = {t.stem: [row for _old, row in tables._CHANGES[str(t.resolve())][2].renewed]
               for t in (layout.nodes, layout.relations)}
    assert [n.label for n in renewed["nodes"]] == ["Source"] and renewed["relations"] == []
    assert tables.read_shared(layout.relations, GraphRelation) == rows_before
    parsed = cas_chunks.load_parsed_files(layout)
    assert parsed and all(a[1] is b[1] for a, b in zip(parsed, cas_chunks.load_parsed_files(layout)))
    nodes = tables.read_shared(layout.nodes, GraphNode)
    assert nodes and nodes is tables.read_shared(layout.nodes, GraphNode)
    assert len(cas_chunks._PARSED) == len(parsed) == warmed_facts  # nothing built again
