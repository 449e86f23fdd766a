"""Neo4jStore against a real server (the session fixture starts a local one unless NEO4J_URI is set)."""
from __future__ import annotations

import os
import threading
import uuid

import pytest

from mtrag_resources.core.models import GraphNode, GraphRelation
from mtrag_resources.stores.contract import BEGIN, COMMITTED, LINKS_SOURCE
from mtrag_resources.stores.neo4j_store import ALLOWED_LABELS, ALLOWED_REL_TYPES, Neo4jStore, chunk_node_id

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]


@pytest.fixture
def sid(neo4j_store):
    """A fresh source id per test; everything it owns is removed afterwards."""
    source_id = f"test-{uuid.uuid4().hex[:12]}"
    yield source_id
    neo4j_store.delete_source(source_id)


def fn(sid, name, label="Function", chunk=True, line=1):
    nid = f"{sid}:{name}"
    return GraphNode(node_id=nid, label=label, name=name.rsplit(".", 1)[-1], qualified_name=f"pkg.{name}",
                     source_id=sid, file_path="pkg/mod.py", start_line=line, end_line=line + 3,
                     chunk_id=f"{sid}-c-{name}" if chunk else "", content_hash="h-" + name)


def rel(sid, t, a, b, confidence="VERIFIED", evidence=True, rid=None):
    return GraphRelation(rel_id=rid or f"{sid}:{t}:{a}->{b}", rel_type=t, src_id=f"{sid}:{a}", dst_id=f"{sid}:{b}",
                         confidence=confidence, candidates=[] if confidence == "VERIFIED" else ["pkg.x", "pkg.y"],
                         evidence_file="pkg/mod.py" if evidence else "", evidence_start=2, evidence_end=2,
                         evidence_hash="e" * 64 if evidence else "", evidence_text=f"{b}()", source_id=sid)


def chunk(chunk_id, sid, symbol="", title="t", role="child", chunk_type="function"):
    return {"chunk_id": chunk_id, "source_id": sid, "role": role, "chunk_type": chunk_type,
            "file_path": "pkg/mod.py", "symbol": symbol, "title": title, "start_line": 1, "end_line": 4,
            "parent_id": None, "text": "MUST NOT BE STORED"}


def code_graph(sid, names=("a", "b", "c", "d")):
    nodes = [GraphNode(node_id=f"{sid}:mod", label="Module", name="mod", qualified_name="pkg.mod",
                       source_id=sid, file_path="pkg/mod.py", start_line=1, end_line=100)]
    nodes += [fn(sid, n, line=10 * i + 1) for i, n in enumerate(names)]
    rels = [rel(sid, "DEFINES", "mod", n) for n in names]
    rels += [rel(sid, "CALLS", a, b) for a, b in zip(names, names[1:])]
    chunks = [chunk(f"{sid}-c-{n}", sid, symbol=f"pkg.{n}", title=n) for n in names]
    return nodes, rels, chunks


# ------------------------------------------------------------------------------------------ writes

def _schema(store) -> tuple[list, list]:
    """The server's constraints and indexes: (name, type, labels or types, properties[, state])."""
    constraints = sorted((r["name"], r["type"], tuple(r["labelsOrTypes"] or ()), tuple(r["properties"] or ()))
                         for r in store._read("SHOW CONSTRAINTS YIELD name, type, labelsOrTypes, properties"))
    indexes = sorted((r["name"], r["type"], tuple(r["labelsOrTypes"] or ()), tuple(r["properties"] or ()), r["state"])
                     for r in store._read("SHOW INDEXES YIELD name, type, labelsOrTypes, properties, state"))
    return constraints, indexes


def test_schema_is_idempotent(neo4j_store):
    neo4j_store.ensure_schema()
    constraints, indexes = _schema(neo4j_store)
    wanted = set(neo4j_store._schema_statements())
    assert wanted <= {name for name, *_ in indexes}  # every rule exists (a constraint by its backing index)
    assert constraints and all(state == "ONLINE" for *_, state in indexes)
    assert neo4j_store.ensure_schema() == {"created": []}
    assert _schema(neo4j_store) == (constraints, indexes)  # nothing added, dropped or changed


def _credentials() -> tuple[str | None, str | None]:
    """As the neo4j_store fixture: a server named by NEO4J_URI may want them, the local one none."""
    if os.environ.get("NEO4J_URI"):
        return os.environ.get("NEO4J_USER"), os.environ.get("NEO4J_PASSWORD")
    return None, None


def test_missing_rules_are_made_again_together_and_beside_a_parallel_writer(neo4j_store, neo4j_uri):
    """Rules gone from the database are made again (in one transaction), online before the call
    returns; two stores making the same missing rules at once (partitions building in parallel)
    both finish, and the schema is whole."""
    from mtrag_resources.stores.neo4j_store import Neo4jStore

    wanted = set(neo4j_store._schema_statements())
    gone = ["mtrag_entity_name", "mtrag_chunk_chunk_id", "mtrag_rel_calls_rel_id"]
    for name in gone:
        neo4j_store._write(f"DROP INDEX {name} IF EXISTS")
    assert sorted(neo4j_store.ensure_schema()["created"]) == sorted(gone)
    constraints, indexes = _schema(neo4j_store)
    assert wanted <= {name for name, *_ in indexes} and all(state == "ONLINE" for *_, state in indexes)

    for name in gone:
        neo4j_store._write(f"DROP INDEX {name} IF EXISTS")
    others = [Neo4jStore(neo4j_uri, *_credentials()) for _ in range(2)]
    start = threading.Barrier(len(others))
    results, errors = [], []

    def make(store) -> None:
        try:
            start.wait()
            results.append(store.ensure_schema())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(store,)) for store in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for store in others:
        store.close()
    assert not errors, errors
    assert all(set(r["created"]) <= set(gone) for r in results) and len(results) == 2
    assert _schema(neo4j_store) == (constraints, indexes)  # the same rules as before, all online


def test_write_is_idempotent(neo4j_store, sid):
    nodes, rels, chunks = code_graph(sid)
    s1 = neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    c1 = neo4j_store.counts(sid)
    s2 = neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    c2 = neo4j_store.counts(sid)
    assert c1 == c2
    assert c1["nodes"] == {"Module": 1, "Function": 4, "Chunk": 4}
    assert c1["relationships"] == {"DEFINES": 4, "CALLS": 3, "HAS_CHUNK": 4}
    assert c1["chunks"] == 4
    assert s1["relationships"] == s2["relationships"] == {"DEFINES": 4, "CALLS": 3, "HAS_CHUNK": 4}
    assert s2["deleted_nodes"] == 0 and s2["deleted_relationships"] == 0
    assert (s1["written_nodes"], s1["written_relationships"]) == (9, 11)  # module, 4 functions, 4 chunks
    assert (s2["written_nodes"], s2["written_relationships"]) == (0, 0)
    m = neo4j_store.marker(sid)
    assert (m.source_id, m.generation, m.state) == (sid, "g1", COMMITTED) and m.committed
    assert neo4j_store.markers()[sid] == m
    # no chunk text in the graph, but the chunk node carries its metadata
    [anchor] = neo4j_store.resolve_anchors([f"{sid}:a"])
    assert anchor["chunk_id"] == f"{sid}-c-a" and anchor["label"] == "Function"


def _projection(store, sid) -> tuple[list, list]:
    """Every node of the source and every relationship of its projection, with all properties."""
    nodes = store._read("MATCH (n:Entity {source_id: $sid}) RETURN n.node_id AS id, labels(n) AS labels, "
                        "properties(n) AS props ORDER BY id", sid=sid)
    rels = store._read("MATCH (a)-[r]->(b) WHERE r.projection = $sid RETURN type(r) AS t, a.node_id AS a, "
                       "b.node_id AS b, properties(r) AS props ORDER BY t, r.rel_id, a, b", sid=sid)
    return nodes, rels


def test_warm_up_plans_and_rehearses_every_write_and_writes_nothing(neo4j_store, sid):
    """warm_up plans every write statement and runs a change's transactions on a sample of what the
    source and the links hold, each rolled back: nothing it touched changes."""
    nodes, rels, chunks = code_graph(sid)
    neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    try:
        neo4j_store.write_links("l1", [rel(sid, "MENTIONS", "a", "b")])
        before, marker, links = neo4j_store.database_counts(), neo4j_store.marker(sid), neo4j_store.marker(LINKS_SOURCE)
        held, held_links = _projection(neo4j_store, sid), _projection(neo4j_store, LINKS_SOURCE)
        assert held[0] and held[1] and held_links[1]
        # the node drop and the delta's begin, a MERGE and a CREATE per row shape (Chunk, Issue, the
        # other labels), the two relationship CREATEs, a relationship drop per type
        assert neo4j_store.warm_up([sid]) == 2 + 2 * 3 + 2 + len(ALLOWED_REL_TYPES)
        assert neo4j_store.database_counts() == before
        assert neo4j_store.marker(sid) == marker and neo4j_store.marker(LINKS_SOURCE) == links
        assert _projection(neo4j_store, sid) == held and _projection(neo4j_store, LINKS_SOURCE) == held_links
        assert neo4j_store.chunk_count(sid) == neo4j_store.counts(sid)["chunks"] == 4
    finally:
        neo4j_store.delete_source(LINKS_SOURCE)


def test_labels_and_types_of_one_row_shape_share_one_statement(neo4j_store, sid, monkeypatch):
    """A first write sends one CREATE text for the nodes of every label with the same properties
    and one for the relationships of every type (the label or type goes as a parameter): a
    just-started server plans each text once (~0.1 s each), not once per label and type. The
    nodes and relationships still get their own label and type."""
    sent: list[str] = []
    real_run_batch = neo4j_store._run_batch
    monkeypatch.setattr(neo4j_store, "_run_batch", lambda session, statements: sent.extend(
        q for q, _ in statements) or real_run_batch(session, statements))
    nodes, rels, chunks = code_graph(sid)
    nodes.append(GraphNode(node_id=f"{sid}:K", label="Class", name="K", qualified_name="pkg.K", source_id=sid,
                           file_path="pkg/mod.py", start_line=90, end_line=99))
    rels.append(rel(sid, "INHERITS", "K", "mod"))
    first = neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    assert first["created_relationships"] == {"DEFINES": 4, "CALLS": 3, "INHERITS": 1, "HAS_CHUNK": 4}
    node_creates = {q for q in sent if " CREATE (n:" in q}
    rel_creates = {q for q in sent if " CREATE (a)-[r:" in q}
    assert len(node_creates) == 2  # Module, Function and Class in one; Chunk's other properties in another
    assert len(rel_creates) == 1   # four types
    nodes_held, rels_held = _projection(neo4j_store, sid)
    assert {n["id"]: sorted(n["labels"]) for n in nodes_held if not n["id"].startswith("chunk:")} == {
        f"{sid}:mod": ["Entity", "Module"], f"{sid}:K": ["Class", "Entity"],
        **{f"{sid}:{x}": ["Entity", "Function"] for x in "abcd"}}
    assert {n["id"]: sorted(n["labels"]) for n in nodes_held if n["id"].startswith("chunk:")} == {
        chunk_node_id(f"{sid}-c-{x}"): ["Chunk", "Entity"] for x in "abcd"}
    assert sorted((r["t"], r["a"], r["b"]) for r in rels_held if r["t"] in ("INHERITS", "CALLS")) == [
        ("CALLS", f"{sid}:a", f"{sid}:b"), ("CALLS", f"{sid}:b", f"{sid}:c"), ("CALLS", f"{sid}:c", f"{sid}:d"),
        ("INHERITS", f"{sid}:K", f"{sid}:mod")]


def test_warm_up_reads_what_a_links_delta_reads(neo4j_store, sid, monkeypatch):
    """The links delta counts what the projection holds after its write: warm_up sends that very read
    (a just-started server planned it in the first watch batch: 0.18 s of Django's links stage)."""
    nodes, rels, chunks = code_graph(sid)
    neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    try:
        first = rel(sid, "MENTIONS", "a", "b")
        neo4j_store.write_links("l1", [first])
        sent: list[str] = []
        real_read = neo4j_store._read
        monkeypatch.setattr(neo4j_store, "_read",
                            lambda query, **params: sent.append(query) or real_read(query, **params))
        neo4j_store.warm_up([sid])
        warmed, sent[:] = set(sent), []
        second = rel(sid, "MENTIONS", "a", "c")
        assert neo4j_store.write_links_delta("l2", "l1", [second], [], {"MENTIONS": 2}) is not None
        assert sent and set(sent) <= warmed
    finally:
        neo4j_store.delete_source(LINKS_SOURCE)


def test_warm_serving_plans_the_reads_a_query_sends_and_writes_nothing(neo4j_store, sid, monkeypatch):
    """warm_serving runs, with nothing to match, the very statements (the plan cache's keys) that an
    exact hit's call paths, the paths command's defaults and the doc -> code bridge send."""
    nodes, rels, chunks = code_graph(sid)
    neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    sent: list[str] = []
    real_read = neo4j_store._read
    monkeypatch.setattr(neo4j_store, "_read", lambda query, **params: sent.append(query) or real_read(query, **params))
    before = neo4j_store.database_counts()
    assert neo4j_store.warm_serving() == 3 + 2 * (2 + 4)
    warmed, sent[:] = set(sent), []
    assert neo4j_store.database_counts() == before
    # what the reader sends (reader.py: _query_paths; the paths command's defaults; bridge.py)
    assert neo4j_store.paths([f"{sid}:a"], rel_types=["CALLS"], direction="out", max_hops=2, verified_only=True,
                             limit=5)
    assert neo4j_store.paths([f"{sid}:a"])
    neo4j_store.paths([f"{sid}:a"], [f"{sid}:c"])
    neo4j_store.bridge([f"{sid}-c-a"])
    assert sent and set(sent) <= warmed


def test_stale_node_removed_in_new_generation(neo4j_store, sid):
    nodes, rels, chunks = code_graph(sid)
    neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    nodes2, rels2, chunks2 = code_graph(sid, names=("a", "b", "c"))  # d disappears
    stats = neo4j_store.write_source(sid, "g2", nodes2, rels2, chunks2)
    c = neo4j_store.counts(sid)
    assert c["nodes"] == {"Module": 1, "Function": 3, "Chunk": 3}
    assert c["relationships"] == {"DEFINES": 3, "CALLS": 2, "HAS_CHUNK": 3}
    assert stats["deleted_nodes"] == 2  # Function d and its Chunk node (their edges went with DETACH)
    assert neo4j_store.resolve_anchors([f"{sid}:d"]) == []
    assert neo4j_store.marker(sid).generation == "g2"


def test_renamed_function(neo4j_store, sid):
    nodes, rels, chunks = code_graph(sid, names=("a", "old_name"))
    neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    assert neo4j_store.resolve_anchors([f"{sid}:old_name"])
    nodes, rels, chunks = code_graph(sid, names=("a", "new_name"))
    neo4j_store.write_source(sid, "g2", nodes, rels, chunks)
    assert neo4j_store.resolve_anchors([f"{sid}:old_name"]) == []
    [new] = neo4j_store.resolve_anchors([f"{sid}:new_name"])
    assert new["qualified_name"] == "pkg.new_name"
    [p] = neo4j_store.paths([f"{sid}:a"], [f"{sid}:new_name"], rel_types=["CALLS"])
    assert [n["node_id"] for n in p["nodes"]] == [f"{sid}:a", f"{sid}:new_name"]
    assert neo4j_store.counts(sid)["relationships"]["CALLS"] == 1


def test_label_change_and_moved_rel_id(neo4j_store, sid):
    nodes, rels, chunks = code_graph(sid, names=("a", "b", "c"))
    neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    nodes[2].label = "Method"  # b: same node id, other kind
    rels = [r for r in rels if r.rel_type != "CALLS"]
    rels.append(rel(sid, "CALLS", "a", "c", rid="stable-call-id"))
    neo4j_store.write_source(sid, "g2", nodes, rels, chunks)
    rels[-1] = rel(sid, "CALLS", "a", "b", rid="stable-call-id")  # same rel id, other endpoint
    neo4j_store.write_source(sid, "g2", nodes, rels, chunks)
    assert neo4j_store.counts(sid)["nodes"] == {"Module": 1, "Method": 1, "Function": 2, "Chunk": 3}
    [a] = neo4j_store.resolve_anchors([f"{sid}:a"])
    assert a["label"] == "Function"
    [p] = neo4j_store.paths([f"{sid}:a"], rel_types="CALLS")
    assert p["nodes"][1]["node_id"] == f"{sid}:b" and p["nodes"][1]["label"] == "Method"
    assert neo4j_store.counts(sid)["relationships"]["CALLS"] == 1


def test_rewrite_touches_only_what_changed(neo4j_store, sid):
    nodes, rels, chunks = code_graph(sid, names=("a", "b", "c", "d"))
    first = neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    assert first["written_relationships"] == 11 and first["written_nodes"] == 9
    assert first["created_relationships"] == {"DEFINES": 4, "CALLS": 3, "HAS_CHUNK": 4}
    expected = neo4j_store.counts(sid)

    # unchanged input (even under a new generation): nothing written, nothing deleted, one read
    same = neo4j_store.write_source(sid, "g2", nodes, rels, chunks)
    assert same["written_relationships"] == 0 and same["written_nodes"] == 0
    assert same["created_relationships"] == {} and same["updated_relationships"] == {}
    assert same["unchanged_relationships"] == {"DEFINES": 4, "CALLS": 3, "HAS_CHUNK": 4}
    assert same["unchanged_nodes"] == 9 and same["transactions"] == 0
    assert same["deleted_nodes"] == 0 and same["deleted_relationships"] == 0
    assert same["relationships"] == first["relationships"]
    assert neo4j_store.counts(sid) == expected
    m = neo4j_store.marker(sid)
    assert (m.generation, m.state) == ("g2", COMMITTED)

    # one relation changes its evidence, one is added, one disappears, one node moves
    calls = {r.rel_id: r for r in rels if r.rel_type == "CALLS"}
    changed = calls[f"{sid}:CALLS:a->b"]
    changed.evidence_start = changed.evidence_end = 42
    rels = [r for r in rels if r.rel_id != f"{sid}:CALLS:c->d"] + [rel(sid, "CALLS", "d", "a")]
    nodes[1].start_line = 99  # function a
    stats = neo4j_store.write_source(sid, "g3", nodes, rels, chunks)
    assert stats["created_relationships"] == {"CALLS": 1}
    assert stats["updated_relationships"] == {"CALLS": 1}
    assert stats["written_relationships"] == 2
    assert stats["unchanged_relationships"] == {"DEFINES": 4, "CALLS": 1, "HAS_CHUNK": 4}
    assert stats["deleted_relationships"] == 1 and stats["deleted_nodes"] == 0
    assert stats["written_nodes"] == 1 and stats["unchanged_nodes"] == 8
    assert stats["relationships"] == {"DEFINES": 4, "CALLS": 3, "HAS_CHUNK": 4}
    assert neo4j_store.counts(sid) == expected
    [p] = neo4j_store.paths([f"{sid}:a"], [f"{sid}:b"], rel_types=["CALLS"])
    assert p["edges"][0]["evidence"]["start_line"] == 42 and p["nodes"][0]["start_line"] == 99
    assert [ids(p) for p in neo4j_store.paths([f"{sid}:d"], [f"{sid}:a"], rel_types=["CALLS"])] == [["d", "a"]]
    assert neo4j_store.paths([f"{sid}:c"], [f"{sid}:d"], rel_types=["CALLS"]) == []

    # a row without a digest (written by an older version, or edited by hand) is rewritten
    neo4j_store._write("MATCH ()-[r:DEFINES {rel_id: $rid}]->() REMOVE r.digest", rid=f"{sid}:DEFINES:mod->a")
    neo4j_store._write("MATCH (n:Entity {node_id: $nid}) REMOVE n.digest", nid=f"{sid}:b")
    stats = neo4j_store.write_source(sid, "g3", nodes, rels, chunks)
    assert stats["updated_relationships"] == {"DEFINES": 1} and stats["created_relationships"] == {}
    assert stats["written_nodes"] == 1 and stats["deleted_relationships"] == 0
    assert neo4j_store.counts(sid) == expected
    again = neo4j_store.write_source(sid, "g3", nodes, rels, chunks)
    assert again["written_relationships"] == 0 and again["written_nodes"] == 0


def test_links_rewrite_only_what_changed(neo4j_store, sid):
    code_sid, docs_sid = sid, sid + "-docs"
    try:
        nodes, rels, chunks = code_graph(code_sid, names=("a", "b"))
        neo4j_store.write_source(code_sid, "g1", nodes, rels, chunks)
        page = GraphNode(node_id=f"{docs_sid}:page", label="Page", name="p", qualified_name="p", source_id=docs_sid)
        neo4j_store.write_source(docs_sid, "d1", [page], [], [])
        links = [GraphRelation(rel_id=f"{sid}-l-{n}", rel_type="MENTIONS", src_id=page.node_id,
                               dst_id=f"{code_sid}:{n}", evidence_file="docs/p.rst", evidence_hash="h",
                               source_id=docs_sid) for n in ("a", "b")]
        assert neo4j_store.write_links("L1", links)["created_relationships"] == {"MENTIONS": 2}
        same = neo4j_store.write_links("L1", links)
        assert same["written_relationships"] == 0 and same["unchanged_relationships"] == {"MENTIONS": 2}
        # the code source drops b: its DETACH DELETE takes the link to b along; the next links
        # write notices it is gone and tries again (b is missing now: skipped and counted)
        nodes2, rels2, chunks2 = code_graph(code_sid, names=("a",))
        neo4j_store.write_source(code_sid, "g2", nodes2, rels2, chunks2)
        again = neo4j_store.write_links("L1", links)
        assert again["skipped_relationships"] == {"MENTIONS": 1} and again["written_relationships"] == 0
        assert again["relationships"] == {"MENTIONS": 1}
        # b comes back: the link is created again
        neo4j_store.write_source(code_sid, "g3", nodes, rels, chunks)
        back = neo4j_store.write_links("L1", links)
        assert back["created_relationships"] == {"MENTIONS": 1} and back["unchanged_relationships"] == {"MENTIONS": 1}
        assert neo4j_store.counts(LINKS_SOURCE)["relationships"] == {"MENTIONS": 2}
    finally:
        neo4j_store.delete_source(docs_sid)
        neo4j_store.delete_source(LINKS_SOURCE)


def test_links_delta_writes_the_change_and_hands_back_to_the_full_write_when_counts_disagree(neo4j_store, sid):
    code_sid, docs_sid = sid, sid + "-docs"
    try:
        nodes, rels, chunks = code_graph(code_sid, names=("a", "b", "c"))
        neo4j_store.write_source(code_sid, "g1", nodes, rels, chunks)
        page = GraphNode(node_id=f"{docs_sid}:page", label="Page", name="p", qualified_name="p", source_id=docs_sid)
        neo4j_store.write_source(docs_sid, "d1", [page], [], [])

        def link(n, text="x"):
            return GraphRelation(rel_id=f"{sid}-l-{n}", rel_type="MENTIONS", src_id=page.node_id,
                                 dst_id=f"{code_sid}:{n}", evidence_file="docs/p.rst", evidence_hash="h",
                                 evidence_text=text, source_id=docs_sid)

        neo4j_store.write_links("L1", [link("a"), link("b")])
        # b changes its evidence, a goes, c comes: only those are written
        stats = neo4j_store.write_links_delta("L2", "L1", [link("b", "new"), link("c")],
                                              [("MENTIONS", f"{sid}-l-a")], {"MENTIONS": 2})
        assert stats["delta_from"] == "L1" and stats["written_relationships"] == 2
        assert neo4j_store.marker(LINKS_SOURCE).generation == "L2"
        assert neo4j_store.marker(LINKS_SOURCE).state == COMMITTED
        held = neo4j_store._read("MATCH ()-[r:MENTIONS]->() WHERE r.projection = $p "
                                 "RETURN r.rel_id AS id, r.evidence_text AS text ORDER BY id", p=LINKS_SOURCE)
        assert [(r["id"], r["text"]) for r in held] == [(f"{sid}-l-b", "new"), (f"{sid}-l-c", "x")]
        # a base the marker does not hold: nothing written, the caller does the full write
        assert neo4j_store.write_links_delta("L3", "L1", [link("a")], [], {"MENTIONS": 3}) is None
        assert neo4j_store.marker(LINKS_SOURCE).generation == "L2"
        # the code source drops c: its DETACH DELETE takes c's link, which the links table still
        # had when Neo4j committed L2 (a build that stopped before its links stage); c comes back:
        # the table is as at L2, but Neo4j lacks the edge, and the counts say so
        nodes2, rels2, chunks2 = code_graph(code_sid, names=("a", "b"))
        neo4j_store.write_source(code_sid, "g2", nodes2, rels2, chunks2)
        neo4j_store.write_source(code_sid, "g3", nodes, rels, chunks)
        assert neo4j_store.write_links_delta("L2", "L2", [], [], {"MENTIONS": 2}) is None
        repaired = neo4j_store.write_links("L2", [link("b", "new"), link("c")])
        assert repaired["created_relationships"] == {"MENTIONS": 1}
        assert neo4j_store.relationship_counts(LINKS_SOURCE) == {"MENTIONS": 2}
        # and with everything in place the same generation writes nothing
        same = neo4j_store.write_links_delta("L2", "L2", [], [], {"MENTIONS": 2})
        assert same["written_relationships"] == 0 and same["transactions"] == 0
    finally:
        neo4j_store.delete_source(docs_sid)
        neo4j_store.delete_source(LINKS_SOURCE)


def test_chunk_counts_of_several_sources_in_one_query_equal_one_by_one(neo4j_store, sid):
    other = sid + "-b"
    try:
        nodes, rels, chunks = code_graph(sid, names=("a", "b", "c"))
        neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
        nodes2, rels2, chunks2 = code_graph(other, names=("x",))
        neo4j_store.write_source(other, "g1", nodes2, rels2, chunks2)
        counts = neo4j_store.chunk_counts([sid, other, sid + "-none"])
        assert counts == {sid: 3, other: 1, sid + "-none": 0}
        assert counts[sid] == neo4j_store.chunk_count(sid) and counts[other] == neo4j_store.chunk_count(other)
    finally:
        neo4j_store.delete_source(other)


def test_missing_endpoint_is_skipped_and_counted(neo4j_store, sid):
    nodes, rels, chunks = code_graph(sid, names=("a", "b"))
    rels.append(rel(sid, "CALLS", "a", "nowhere"))
    stats = neo4j_store.write_source(sid, "g1", nodes, rels, chunks[:1])  # b's chunk missing too
    assert stats["skipped_relationships"] == {"CALLS": 1, "HAS_CHUNK": 1}
    assert neo4j_store.counts(sid)["relationships"] == {"DEFINES": 2, "CALLS": 1, "HAS_CHUNK": 1}


def test_first_write_creates_without_merge(neo4j_store, sid, monkeypatch):
    """A source's first write CREATEs every node and relationship (no per-row MERGE); a rewrite
    that changes a node MERGEs just that one."""
    sent: list[str] = []
    real = Neo4jStore._run_batch

    def spy(self, session, statements):
        sent.extend(q for q, _ in statements)
        return real(self, session, statements)

    monkeypatch.setattr(Neo4jStore, "_run_batch", spy)
    nodes, rels, chunks = code_graph(sid)
    first = neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    assert (first["written_nodes"], first["written_relationships"]) == (9, 11)
    assert sent and not any("MERGE (n:Entity" in q for q in sent)
    assert any("CREATE (n:Entity:$($label)" in q for q in sent)
    sent.clear()
    nodes[1].start_line = 77
    again = neo4j_store.write_source(sid, "g2", nodes, rels, chunks)
    assert again["written_nodes"] == 1 and again["written_relationships"] == 0
    assert [q for q in sent if "(n:Entity" in q and "MERGE" in q] and not any("CREATE (n:Entity" in q for q in sent)


def test_relationships_between_nodes_the_write_created_find_them_by_internal_id(neo4j_store, sid, monkeypatch):
    """A first write's relationships find their endpoints by the ids the nodes' CREATE returned (no
    node_id index seek); a later write's new edge to a node it did not create finds it by node_id.
    Either way the projection holds the same edges, endpoints and properties."""
    sent: list[tuple[str, int]] = []
    real = Neo4jStore._run_batch

    def spy(self, session, statements):
        sent.extend((q, len(params.get("rows") or ())) for q, params in statements)
        return real(self, session, statements)

    monkeypatch.setattr(Neo4jStore, "_run_batch", spy)
    nodes, rels, chunks = code_graph(sid)
    first = neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    assert first["written_relationships"] == 11
    by_id = sum(n for q, n in sent if "WHERE id(a) = row[0]" in q)
    by_key = sum(n for q, n in sent if "USING INDEX SEEK a:Entity(node_id)" in q and "CREATE (a)" in q)
    assert (by_id, by_key) == (11, 0)
    held = _projection(neo4j_store, sid)[1]
    assert {(r["t"], r["a"], r["b"]) for r in held} == (
        {("DEFINES", f"{sid}:mod", f"{sid}:{n}") for n in "abcd"}
        | {("CALLS", f"{sid}:{a}", f"{sid}:{b}") for a, b in ("ab", "bc", "cd")}
        | {("HAS_CHUNK", f"{sid}:{n}", f"chunk:{sid}-c-{n}") for n in "abcd"})
    assert all(r["props"]["projection"] == sid and r["props"]["digest"] for r in held)
    assert {r["props"]["evidence_text"] for r in held if r["t"] == "CALLS"} == {"b()", "c()", "d()"}

    sent.clear()  # a new function calling an old one: its own DEFINES by id, the CALLS to `a` by node_id
    nodes.append(fn(sid, "e", chunk=False, line=60))
    rels += [rel(sid, "DEFINES", "mod", "e"), rel(sid, "CALLS", "e", "a")]
    again = neo4j_store.write_source(sid, "g2", nodes, rels, chunks)
    assert again["written_relationships"] == 2 and again["written_nodes"] == 1
    assert sum(n for q, n in sent if "WHERE id(a) = row[0]" in q) == 0  # `mod` was not created by this write
    assert sum(n for q, n in sent if "USING INDEX SEEK a:Entity(node_id)" in q and "CREATE (a)" in q) == 2
    assert neo4j_store.counts(sid)["relationships"] == {"DEFINES": 5, "CALLS": 4, "HAS_CHUNK": 4}


def test_node_id_held_by_another_source_is_taken_over(neo4j_store, sid):
    """A node_id that another source's projection holds is new to this one: its CREATE fails the
    node_id constraint, the transaction runs again with MERGE, and the node moves over (as MERGE
    always did), without the other source's relationships being touched."""
    other = sid + "-other"
    try:
        shared = GraphNode(node_id=f"{sid}:shared", label="Module", name="shared", qualified_name="pkg.shared",
                           source_id=other, file_path="pkg/shared.py")
        neo4j_store.write_source(other, "o1", [shared], [], [])
        nodes, rels, chunks = code_graph(sid, names=("a", "b"))
        moved = GraphNode(**{**shared.__dict__, "source_id": sid, "label": "File"})
        rels.append(rel(sid, "CONTAINS", "shared", "a"))
        stats = neo4j_store.write_source(sid, "g1", nodes + [moved], rels, chunks)
        assert stats["written_nodes"] == 6 and stats["skipped_relationships"] == {}
        assert neo4j_store.counts(sid)["nodes"] == {"Module": 1, "File": 1, "Function": 2, "Chunk": 2}
        assert neo4j_store.counts(other)["total_nodes"] == 0
        [anchor] = neo4j_store.resolve_anchors([f"{sid}:shared"])
        assert (anchor["source_id"], anchor["label"]) == (sid, "File")
        again = neo4j_store.write_source(sid, "g1", nodes + [moved], rels, chunks)
        assert again["written_nodes"] == 0 and again["written_relationships"] == 0
        assert neo4j_store.marker(sid).state == COMMITTED
    finally:
        neo4j_store.delete_source(other)


def test_invalid_input_rejected_before_any_write(neo4j_store, sid):
    nodes, rels, chunks = code_graph(sid)
    bad = GraphNode(node_id=f"{sid}:x", label="Function:Admin", name="x", qualified_name="x", source_id=sid)
    with pytest.raises(ValueError):
        neo4j_store.write_source(sid, "g1", nodes + [bad], rels, chunks)
    with pytest.raises(ValueError):
        neo4j_store.write_source(sid, "g1", nodes, rels + [rel(sid, "CALLS]->() DETACH DELETE a //", "a", "b")],
                                 chunks)
    foreign = fn("other-source", "z")
    with pytest.raises(ValueError):
        neo4j_store.write_source(sid, "g1", nodes + [foreign], rels, chunks)
    assert neo4j_store.marker(sid) is None
    assert neo4j_store.counts(sid)["total_nodes"] == 0


def test_failed_write_leaves_begin_then_converges(neo4j_store, sid, monkeypatch):
    nodes, rels, chunks = code_graph(sid, names=("a", "b", "c", "d"))
    neo4j_store.write_source(sid, "g1", nodes, rels, chunks)
    expected = neo4j_store.counts(sid)

    nodes2, rels2, chunks2 = code_graph(sid, names=("a", "b", "c", "e"))
    small = Neo4jStore.__new__(Neo4jStore)
    small.__dict__.update(neo4j_store.__dict__)
    small.batch_size = 2  # several batches per group
    calls = {"n": 0}
    real = Neo4jStore._run_batch

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("injected failure after 3 batches")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Neo4jStore, "_run_batch", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        small.write_source(sid, "g2", nodes2, rels2, chunks2)
    m = neo4j_store.marker(sid)
    assert (m.generation, m.state) == ("g2", BEGIN) and not m.committed
    monkeypatch.setattr(Neo4jStore, "_run_batch", real)

    small.write_source(sid, "g2", nodes2, rels2, chunks2)
    m = neo4j_store.marker(sid)
    assert (m.generation, m.state) == ("g2", COMMITTED)
    assert neo4j_store.counts(sid) == expected  # same shape: d replaced by e
    assert neo4j_store.resolve_anchors([f"{sid}:d"]) == []
    assert neo4j_store.resolve_anchors([f"{sid}:e"])
    again = small.write_source(sid, "g2", nodes2, rels2, chunks2)  # converged: nothing left to write
    assert again["written_relationships"] == 0 and again["written_nodes"] == 0 and again["transactions"] == 0


def _copy(store, **attrs):
    """The same driver with other write settings (batch size, concurrent writers)."""
    other = Neo4jStore.__new__(Neo4jStore)
    other.__dict__.update(store.__dict__)
    other.__dict__.update(attrs)
    return other


def test_a_bulk_first_write_runs_transactions_concurrently_and_commits_last(neo4j_store, sid, monkeypatch):
    names = tuple(f"f{i}" for i in range(12))
    nodes, rels, chunks = code_graph(sid, names=names)
    events: list[tuple] = []
    # the first two transactions of the writers wait for each other: one at a time, the first waits
    # alone and the barrier breaks (the write fails)
    both_in_flight = threading.Barrier(2, timeout=30)
    writer_calls = iter(range(10**6))
    real = Neo4jStore._run_batch

    def recording(self, session, statements):
        marker = any(q == Neo4jStore._MARKER for q, _ in statements)
        events.append(("start", threading.current_thread().name, marker))
        if threading.current_thread().name.startswith("neo4j-writer") and next(writer_calls) < 2:
            both_in_flight.wait()
        try:
            return real(self, session, statements)
        finally:
            events.append(("end", threading.current_thread().name, marker))

    monkeypatch.setattr(Neo4jStore, "_run_batch", recording)
    stats = _copy(neo4j_store, batch_size=3, writers=2).write_source(sid, "g1", nodes, rels, chunks)
    monkeypatch.setattr(Neo4jStore, "_run_batch", real)

    writers = {name for _, name, _ in events if name.startswith("neo4j-writer")}
    assert len(writers) == 2
    commit_start = events.index(next(e for e in events if e[0] == "start" and e[2]))
    assert [e for e in events if e[2]] == [events[commit_start], events[-1]]  # the marker's transaction came last
    assert len([e for e in events[:commit_start] if e[0] == "end"]) == len(
        [e for e in events[:commit_start] if e[0] == "start"])  # ... after every other one had ended
    assert neo4j_store.marker(sid).state == COMMITTED
    counts = neo4j_store.counts(sid)
    assert counts["total_nodes"] == len(nodes) + len(chunks) and stats["written_nodes"] == counts["total_nodes"]
    assert counts["relationships"] == {"DEFINES": 12, "CALLS": 11, "HAS_CHUNK": 12}
    # one transaction at a time finds every row the concurrent ones wrote exactly as it would write it
    again = _copy(neo4j_store, writers=1).write_source(sid, "g1", nodes, rels, chunks)
    assert again["written_relationships"] == 0 and again["written_nodes"] == 0 and again["transactions"] == 0


def test_a_failed_concurrent_transaction_fails_the_write_then_a_rerun_converges(neo4j_store, sid, monkeypatch):
    nodes, rels, chunks = code_graph(sid, names=tuple(f"f{i}" for i in range(12)))
    bulk = _copy(neo4j_store, batch_size=3, writers=2)
    real = Neo4jStore._run_batch
    calls = {"writer": 0}
    lock = threading.Lock()

    def flaky(self, session, statements):
        if threading.current_thread().name.startswith("neo4j-writer"):
            with lock:
                calls["writer"] += 1
                n = calls["writer"]
            if n == 3:
                raise RuntimeError("injected failure in a concurrent transaction")
        return real(self, session, statements)

    monkeypatch.setattr(Neo4jStore, "_run_batch", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        bulk.write_source(sid, "g1", nodes, rels, chunks)
    assert neo4j_store.marker(sid).state == BEGIN
    monkeypatch.setattr(Neo4jStore, "_run_batch", real)
    bulk.write_source(sid, "g1", nodes, rels, chunks)
    assert neo4j_store.marker(sid).state == COMMITTED
    assert neo4j_store.counts(sid)["relationships"] == {"DEFINES": 12, "CALLS": 11, "HAS_CHUNK": 12}
    again = bulk.write_source(sid, "g1", nodes, rels, chunks)
    assert again["written_relationships"] == 0 and again["written_nodes"] == 0


# --------------------------------------------------------------------------------------- queries

@pytest.fixture
def chain(neo4j_store, sid):
    """a -CALLS-> b -CALLS-> c -CALLS-> d ... -> h (7 hops), b -IMPORTS-> x, a -CALLS(INFERRED)-> y,
    a -CALLS(VERIFIED, no evidence)-> z, and y -CALLS-> d."""
    names = ["a", "b", "c", "d", "e", "f", "g", "h", "x", "y", "z"]
    nodes = [fn(sid, n, line=i * 10 + 1) for i, n in enumerate(names)]
    chain_names = names[:8]
    rels = [rel(sid, "CALLS", a, b) for a, b in zip(chain_names, chain_names[1:])]
    rels += [rel(sid, "IMPORTS", "b", "x"),
             rel(sid, "CALLS", "a", "y", confidence="INFERRED", evidence=False),
             rel(sid, "CALLS", "a", "z", evidence=False),
             rel(sid, "CALLS", "y", "d")]
    neo4j_store.write_source(sid, "g1", nodes, rels, [])
    return sid


def ids(path):
    return [n["node_id"].split(":", 1)[1] for n in path["nodes"]]


def test_paths_direction_allowlist_hops(neo4j_store, chain):
    s = chain
    ps = neo4j_store.paths([f"{s}:a"], [f"{s}:d"])
    assert [ids(p) for p in ps] == [["a", "b", "c", "d"]]  # the y-route is INFERRED
    p = ps[0]
    assert p["hops"] == 3 and len(p["edges"]) == 3
    e = p["edges"][0]
    assert e["type"] == "CALLS" and e["from"] == f"{s}:a" and e["to"] == f"{s}:b"
    assert e["confidence"] == "VERIFIED"
    assert e["evidence"] == {"file": "pkg/mod.py", "start_line": 2, "end_line": 2, "hash": "e" * 64, "text": "b()"}
    assert set(p["nodes"][0]) >= {"node_id", "label", "name", "qualified_name", "file_path", "start_line"}

    # verified_only=False also finds the INFERRED route, shortest first
    ps = neo4j_store.paths([f"{s}:a"], [f"{s}:d"], verified_only=False)
    assert [ids(p) for p in ps] == [["a", "y", "d"], ["a", "b", "c", "d"]]
    assert [p["hops"] for p in ps] == [2, 3]

    # direction: nothing reaches a; from d going in reaches a
    assert neo4j_store.paths([f"{s}:d"], [f"{s}:a"]) == []
    assert [ids(p) for p in neo4j_store.paths([f"{s}:d"], [f"{s}:a"], direction="in")] == [["d", "c", "b", "a"]]
    assert [ids(p) for p in neo4j_store.paths([f"{s}:d"], [f"{s}:a"], direction="both")] == [["d", "c", "b", "a"]]

    # allowlist: x is reached only over IMPORTS
    assert neo4j_store.paths([f"{s}:a"], [f"{s}:x"], rel_types=["CALLS"]) == []
    [p] = neo4j_store.paths([f"{s}:a"], [f"{s}:x"], rel_types="calls,imports")
    assert [e["type"] for e in p["edges"]] == ["CALLS", "IMPORTS"]

    # hop bound: h is 7 hops away; max_hops=8 is clamped to hard_max_hops=6
    assert neo4j_store.paths([f"{s}:a"], [f"{s}:g"], max_hops=5) == []
    assert [p["hops"] for p in neo4j_store.paths([f"{s}:a"], [f"{s}:g"], max_hops=6)] == [6]
    assert neo4j_store.paths([f"{s}:a"], [f"{s}:h"], max_hops=8) == []
    assert neo4j_store.paths([f"{s}:a"], [f"{s}:h"], max_hops=8, hard_max_hops=7)[0]["hops"] == 7

    # no target: expansions from the anchor, shortest first, bounded by limit
    ps = neo4j_store.paths([f"{s}:a"], rel_types=["CALLS", "IMPORTS"], max_hops=2, limit=10)
    assert [ids(p) for p in ps] == [["a", "b"], ["a", "b", "c"], ["a", "b", "x"]]
    assert len(neo4j_store.paths([f"{s}:a"], max_hops=6, limit=2)) == 2
    # verified_only drops z (VERIFIED but no evidence) and y (INFERRED)
    reached = {ids(p)[-1] for p in neo4j_store.paths([f"{s}:a"], max_hops=1, verified_only=False)}
    assert reached == {"b", "y", "z"}


def test_paths_reject_bad_arguments(neo4j_store, chain):
    s = chain
    for kwargs in ({"max_hops": 0}, {"max_hops": -1}, {"max_hops": "3"}, {"max_hops": 2.5}, {"max_hops": True},
                   {"rel_types": ["CALLS", "FOO"]}, {"rel_types": ["CALLS*1..99]-(x) DETACH DELETE x //"]},
                   {"rel_types": []}, {"direction": "sideways"}):
        with pytest.raises(ValueError):
            neo4j_store.paths([f"{s}:a"], **kwargs)
    assert neo4j_store.paths(["no such thing"]) == []


def test_links_and_bridge(neo4j_store, sid):
    code_sid, docs_sid = sid, sid + "-docs"
    try:
        nodes, rels, chunks = code_graph(code_sid, names=("echo", "command"))
        neo4j_store.write_source(code_sid, "g1", nodes, rels, chunks)
        page = GraphNode(node_id=f"{docs_sid}:page", label="Page", name="api", qualified_name="api",
                         source_id=docs_sid, file_path="docs/api.rst")
        section = GraphNode(node_id=f"{docs_sid}:sec", label="Section", name="Echo", qualified_name="api/Echo",
                            source_id=docs_sid, file_path="docs/api.rst", start_line=5,
                            chunk_id=f"{docs_sid}-c-sec")
        doc_chunks = [chunk(f"{docs_sid}-c-sec", docs_sid, symbol="api/Echo", role="parent", chunk_type="section"),
                      chunk(f"{docs_sid}-c-p1", docs_sid, symbol="api/Echo", chunk_type="passage")]
        neo4j_store.write_source(docs_sid, "d1", [page, section],
                                 [GraphRelation(f"{docs_sid}:contains", "CONTAINS", page.node_id, section.node_id,
                                                evidence_file="docs/api.rst", evidence_hash="x", source_id=docs_sid)],
                                 doc_chunks)

        def link(rid, t, src, dst, confidence="VERIFIED"):
            return GraphRelation(rel_id=rid, rel_type=t, src_id=src, dst_id=dst, confidence=confidence,
                                 evidence_file="docs/api.rst", evidence_start=7, evidence_end=7,
                                 evidence_hash="f" * 64, evidence_text=":func:`pkg.echo`", source_id=docs_sid)

        links = [link(f"{sid}-l1", "MENTIONS", chunk_node_id(f"{docs_sid}-c-p1"), f"{code_sid}:echo"),
                 link(f"{sid}-l2", "IMPLEMENTS", section.node_id, f"{code_sid}:command", confidence="INFERRED"),
                 link(f"{sid}-l3", "MENTIONS", chunk_node_id(f"{docs_sid}-c-p1"), f"{code_sid}:missing")]
        stats = neo4j_store.write_links("L1", links)
        assert stats["relationships"] == {"MENTIONS": 1, "IMPLEMENTS": 1}
        assert stats["skipped_relationships"] == {"MENTIONS": 1}
        m = neo4j_store.marker(LINKS_SOURCE)
        assert (m.generation, m.state) == ("L1", COMMITTED)

        got = neo4j_store.bridge([f"{docs_sid}-c-p1", f"{docs_sid}-c-sec", "unknown-chunk"])
        assert [(g["from_chunk_id"], g["symbol"], g["relation"], g["confidence"]) for g in got] == [
            (f"{docs_sid}-c-p1", "pkg.echo", "MENTIONS", "VERIFIED"),
            (f"{docs_sid}-c-sec", "pkg.command", "IMPLEMENTS", "INFERRED"),  # via the Section owning the chunk
        ]
        g = got[0]
        assert g["file_path"] == "pkg/mod.py" and g["start_line"] == 1
        assert g["evidence"] == {"file": "docs/api.rst", "start_line": 7, "end_line": 7, "hash": "f" * 64,
                                 "text": ":func:`pkg.echo`"}
        assert [x["symbol"] for x in neo4j_store.bridge([f"{docs_sid}-c-sec"], verified_only=True)] == []
        assert [x["relation"] for x in neo4j_store.bridge([f"{docs_sid}-c-p1"], rel_types=["IMPLEMENTS"])] == []
        # the same reference text wherever the docs make it: every target the links gave it
        found = neo4j_store.resolved_references([":func:`pkg.echo`", ":func:`other`"])
        assert sorted((r["text"], r["symbol"], r["confidence"]) for r in found) == [
            (":func:`pkg.echo`", "pkg.command", "INFERRED"), (":func:`pkg.echo`", "pkg.echo", "VERIFIED")]
        assert neo4j_store.resolved_references([]) == []

        # doc -> code paths go through chunk nodes too
        ps = neo4j_store.paths([section.node_id], [f"{code_sid}:command"], rel_types=["IMPLEMENTS"],
                               verified_only=False)
        assert [len(p["edges"]) for p in ps] == [1]

        # a new links generation drops the stale link; code counts are untouched
        stats = neo4j_store.write_links("L2", links[:1])
        assert stats["deleted_relationships"] == 1
        assert neo4j_store.counts(LINKS_SOURCE)["relationships"] == {"MENTIONS": 1}
        assert [g["relation"] for g in neo4j_store.bridge([f"{docs_sid}-c-sec"])] == []
        assert neo4j_store.counts(code_sid)["relationships"]["CALLS"] == 1
        # rewriting the code source leaves the links (owned by __links__) alone
        neo4j_store.write_source(code_sid, "g2", nodes, rels, chunks)
        assert neo4j_store.counts(LINKS_SOURCE)["relationships"] == {"MENTIONS": 1}
    finally:
        neo4j_store.delete_source(docs_sid)
        neo4j_store.delete_source(LINKS_SOURCE)


INJECTIONS = [
    "x' OR 1=1 //",
    'x" OR 1=1 //',
    "`Entity`",
    "a}) MATCH (n) DETACH DELETE n //",
    "}) RETURN 1 UNION MATCH (n) DETACH DELETE n //",
    "MATCH (n) DETACH DELETE n",
    "// comment",
    "/* */ \\' \\\" \\u0027",
    "$names",
    "x`]->() DETACH DELETE n //",
    "名前 'quoted' `tick` \n newline",
]


def test_injection_strings_are_plain_data(neo4j_store, sid):
    weird_sid = sid + "'}) MATCH (n) DETACH DELETE n //"
    nodes = [GraphNode(node_id=f"{weird_sid}#{i}", label="Function", name=s, qualified_name="q." + s,
                       source_id=weird_sid, file_path=s, chunk_id=s) for i, s in enumerate(INJECTIONS)]
    rels = [GraphRelation(rel_id=s, rel_type="CALLS", src_id=nodes[i].node_id, dst_id=nodes[i + 1].node_id,
                          candidates=[s], evidence_file=s, evidence_hash=s, evidence_text=s, source_id=weird_sid)
            for i, s in enumerate(INJECTIONS[:-1])]
    chunks = [chunk(s, weird_sid, symbol=s, title=s) for s in INJECTIONS]
    try:
        before = neo4j_store.database_counts()
        gen = "gen'}) DETACH DELETE n //"
        stats = neo4j_store.write_source(weird_sid, gen, nodes, rels, chunks)
        assert stats["nodes"] == {"Function": len(INJECTIONS)}
        assert neo4j_store.marker(weird_sid).generation == gen
        after = neo4j_store.database_counts()
        n = len(INJECTIONS)
        assert after["nodes"] == before["nodes"] + 2 * n + 1  # entities, chunk nodes, marker
        assert after["relationships"] == before["relationships"] + (n - 1) + n  # CALLS + HAS_CHUNK

        for i, s in enumerate(INJECTIONS):
            got = neo4j_store.resolve_anchors([s])
            assert [g["name"] for g in got] == [s]
            assert neo4j_store.paths([s], [s]) == []
            # from entity i the CALLS chain goes i -> i+1 -> i+2: one path per hop, shortest first
            chain = [[nodes[j].node_id for j in range(i, i + h + 1)] for h in (1, 2) if i + h < n]
            expanded = neo4j_store.paths([s], max_hops=2, limit=3)
            assert [[x["node_id"] for x in p["nodes"]] for p in expanded] == chain
            assert all(e["evidence"]["text"] == INJECTIONS[i + k] for p in expanded for k, e in enumerate(p["edges"]))
            assert neo4j_store.bridge([s]) == []
            assert neo4j_store.marker(s) is None
            assert neo4j_store.counts(s)["total_nodes"] == 0
            assert neo4j_store.delete_source(s) == {"deleted_nodes": 0, "deleted_relationships": 0}
        [p] = neo4j_store.paths([INJECTIONS[0]], [INJECTIONS[1]])
        assert p["edges"][0]["evidence"]["text"] == INJECTIONS[0]
        assert neo4j_store.database_counts() == after
    finally:
        neo4j_store.delete_source(weird_sid)
    assert neo4j_store.database_counts() == before


def test_a_process_that_keeps_drivers_opens_one_store_per_server(neo4j_uri, tmp_path, monkeypatch):
    """keep_neo4j_drivers (`mtrag watch`): every open_neo4j of the process gives the one kept store,
    whose close leaves it open for the next, and which checks the indexes once per server process
    (again after a failed batch forgets it, or when the local server is another process); a caller
    with driver settings of its own gets a store of its own."""
    from mtrag_resources.core.config import Settings
    from mtrag_resources.stores import connect, neo4j_server
    monkeypatch.setenv("NEO4J_URI", neo4j_uri)
    monkeypatch.setattr(connect, "_KEEP_DRIVERS", False)
    monkeypatch.setattr(connect, "_DRIVERS", {})
    monkeypatch.setattr(connect, "_SCHEMA_CHECKED", {})
    settings = Settings(home=tmp_path)
    apart = connect.open_neo4j(settings)
    assert isinstance(apart, Neo4jStore)
    apart.close()
    connect.keep_neo4j_drivers()
    with connect.open_neo4j(settings) as first:
        assert not first._schema_ok
        first.ensure_schema_once()
        assert first._schema_ok
    with connect.open_neo4j(settings) as second:
        assert second is first and second._schema_ok  # closed by neither block; checked already
        assert second.markers() is not None
    connect.forget_neo4j_schemas()
    with connect.open_neo4j(settings) as third:
        assert third is first and not third._schema_ok
        third.ensure_schema_once()
    monkeypatch.setattr(neo4j_server, "running_pid", lambda _settings: 4242)  # a restarted local server
    with connect.open_neo4j(settings) as fourth:
        assert fourth is first and not fourth._schema_ok
    own = connect.open_neo4j(settings, connection_acquisition_timeout=5.0)
    assert isinstance(own, Neo4jStore) and own is not first
    own.close()
    assert connect.close_kept_neo4j_drivers() == 1 and connect._DRIVERS == {}
