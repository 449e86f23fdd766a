"""The Neo4j projection of the canonical graph, and the graph queries the serving side needs.

This is the ONLY module that builds Cypher. Labels, relationship types and hop bounds are the only
things interpolated into query text, and only after validation against the allowlists below (hop
bounds are ints); every user string (names, ids, source ids, generations) goes as a parameter.

Model:
- every entity node has the label `Entity` plus its specific label; `node_id` is unique.
- one `:Chunk:Entity` node per chunk (`node_id = "chunk:" + chunk_id`, no text), linked
  `(entity)-[:HAS_CHUNK]->(chunk)` for each entity whose `chunk_id` matches.
- relationships are MERGEd by `rel_id` between their endpoints and carry confidence + evidence.
- ownership: nodes belong to their `source_id`; relationships carry `projection`, the marker key
  of the write that owns them (the source id, or `__links__` for cross-source links), so stale
  removal of one projection never touches another's relationships.
- every write stamps `generation` and a fresh `write_id`; after the MERGE phase, everything the
  projection owns with another `write_id` is deleted. So a rerun with the same generation converges
  too, even after a half-finished write.
- `(:ProjectionMarker {source_id, generation, state})` brackets each write: 'begin' first,
  'committed' only after the stale removal.
"""
from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict

from neo4j import GraphDatabase, RoutingControl
from neo4j.exceptions import ClientError

from mtrag_resources.models import GraphNode, GraphRelation
from mtrag_resources.stores.markers import BEGIN, COMMITTED, LINKS_SOURCE, Marker

ALLOWED_LABELS = ("Source", "File", "Module", "Class", "Function", "Method", "Page", "Section", "Chunk")
ALLOWED_REL_TYPES = ("CONTAINS", "DEFINES", "IMPORTS", "INHERITS", "CALLS", "MENTIONS", "IMPLEMENTS",
                     "HAS_CHUNK")
# relations a path query follows when the caller names none (HAS_CHUNK is bookkeeping, not a relation)
DEFAULT_PATH_TYPES = ("CONTAINS", "DEFINES", "IMPORTS", "INHERITS", "CALLS", "MENTIONS", "IMPLEMENTS")
BRIDGE_TYPES = ("MENTIONS", "IMPLEMENTS")
DIRECTIONS = ("out", "in", "both")
VERIFIED = "VERIFIED"

BATCH_SIZE = 2000
DELETE_BATCH = 10000

NODE_PROPS = ("node_id", "name", "qualified_name", "source_id", "file_path", "start_line", "end_line",
              "chunk_id", "content_hash")
CHUNK_PROPS = ("chunk_id", "source_id", "role", "chunk_type", "file_path", "symbol", "title",
               "start_line", "end_line", "parent_id")
REL_PROPS = ("rel_id", "confidence", "candidates", "evidence_file", "evidence_start", "evidence_end",
             "evidence_hash", "evidence_text", "source_id")

CHUNK_NODE_PREFIX = "chunk:"


def chunk_node_id(chunk_id: str) -> str:
    return CHUNK_NODE_PREFIX + chunk_id


def check_label(label: str) -> str:
    if not isinstance(label, str) or label not in ALLOWED_LABELS:
        raise ValueError(f"node label {label!r} is not one of {ALLOWED_LABELS}")
    return label


def check_rel_type(rel_type: str) -> str:
    if not isinstance(rel_type, str) or rel_type not in ALLOWED_REL_TYPES:
        raise ValueError(f"relationship type {rel_type!r} is not one of {ALLOWED_REL_TYPES}")
    return rel_type


def check_rel_types(rel_types: str | Iterable[str] | None, default: Sequence[str] = DEFAULT_PATH_TYPES) -> list[str]:
    """Validate an allowlist given as a list or a comma-separated string (case-insensitive)."""
    if rel_types is None:
        return list(default)
    if isinstance(rel_types, str):
        rel_types = rel_types.split(",")
    out: list[str] = []
    for t in rel_types:
        if not isinstance(t, str):
            raise ValueError(f"relationship type {t!r} is not a string")
        t = t.strip().upper()
        if t and t not in out:
            out.append(check_rel_type(t))
    if not out:
        raise ValueError("empty relationship type list")
    return out


def check_hops(max_hops: int, hard_max_hops: int) -> int:
    for v in (max_hops, hard_max_hops):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"hop bound {v!r} is not an int")
    if max_hops < 1 or hard_max_hops < 1:
        raise ValueError(f"hop bound must be >= 1 (got max_hops={max_hops}, hard_max_hops={hard_max_hops})")
    return min(max_hops, hard_max_hops)


def _batches(rows: list, size: int) -> Iterable[list]:
    for i in range(0, len(rows), size):
        yield rows[i:i + size]


# A node's specific label, as a Cypher expression (labels(n) minus Entity).
_LABEL_EXPR = "head([l IN labels({v}) WHERE l <> 'Entity'])"
_NODE_MAP = ("{{node_id: {v}.node_id, label: " + _LABEL_EXPR + ", name: {v}.name, "
             "qualified_name: {v}.qualified_name, file_path: {v}.file_path, start_line: {v}.start_line}}")
_EDGE_MAP = ("{{type: type({r}), rel_id: {r}.rel_id, from: startNode({r}).node_id, to: endNode({r}).node_id, "
             "confidence: {r}.confidence, candidates: {r}.candidates, "
             "evidence: {{file: {r}.evidence_file, start_line: {r}.evidence_start, end_line: {r}.evidence_end, "
             "hash: {r}.evidence_hash, text: {r}.evidence_text}}}}")
_VERIFIED_PRED = ("{r}.confidence = 'VERIFIED' AND coalesce({r}.evidence_file, '') <> '' "
                  "AND coalesce({r}.evidence_hash, '') <> ''")


class Neo4jStore:
    """Owns one driver. Write methods are idempotent and marker-bracketed; read methods are read-only."""

    def __init__(self, uri: str, user: str | None = None, password: str | None = None,
                 database: str | None = None, batch_size: int = BATCH_SIZE):
        auth = (user, password or "") if user else None
        self.uri = uri
        self.database = database
        self.batch_size = batch_size
        self._driver = GraphDatabase.driver(uri, auth=auth)

    def close(self) -> None:
        self._driver.close()

    def __enter__(self) -> "Neo4jStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------ plumbing
    def _read(self, query: str, **params) -> list[dict]:
        records, _, _ = self._driver.execute_query(query, parameters_=params, database_=self.database,
                                                   routing_=RoutingControl.READ)
        return [r.data() for r in records]

    def _write(self, query: str, **params) -> list[dict]:
        records, _, _ = self._driver.execute_query(query, parameters_=params, database_=self.database,
                                                   routing_=RoutingControl.WRITE)
        return [r.data() for r in records]

    def _run_batch(self, query: str | tuple[str, ...], rows: list[dict], **params) -> list[dict]:
        """One UNWIND batch in its own (retried) write transaction; a tuple of statements runs in
        that one transaction, and the last one's records are returned. Tests patch this to inject
        failures."""
        queries = (query,) if isinstance(query, str) else tuple(query)

        def work(tx):
            out: list[dict] = []
            for q in queries:
                out = [r.data() for r in tx.run(q, rows=rows, **params)]
            return out

        with self._driver.session(database=self.database) as session:
            return session.execute_write(work)

    def _delete_loop(self, query: str, **params) -> int:
        """Run a `... WITH x LIMIT $limit DELETE x RETURN count(*) AS n` query until it deletes nothing."""
        total = 0
        while True:
            n = self._write(query, limit=DELETE_BATCH, **params)[0]["n"]
            total += n
            if n < DELETE_BATCH:
                return total

    # -------------------------------------------------------------------------------- schema
    def ensure_schema(self) -> None:
        stmts = [
            "CREATE CONSTRAINT mtrag_entity_node_id IF NOT EXISTS FOR (n:Entity) REQUIRE n.node_id IS UNIQUE",
            "CREATE CONSTRAINT mtrag_marker_source IF NOT EXISTS FOR (m:ProjectionMarker) REQUIRE m.source_id IS UNIQUE",
            "CREATE INDEX mtrag_entity_name IF NOT EXISTS FOR (n:Entity) ON (n.name)",
            "CREATE INDEX mtrag_entity_qualified_name IF NOT EXISTS FOR (n:Entity) ON (n.qualified_name)",
            "CREATE INDEX mtrag_entity_source_id IF NOT EXISTS FOR (n:Entity) ON (n.source_id)",
            "CREATE INDEX mtrag_chunk_chunk_id IF NOT EXISTS FOR (c:Chunk) ON (c.chunk_id)",
        ]
        for t in ALLOWED_REL_TYPES:
            t = check_rel_type(t)
            low = t.lower()
            stmts.append(f"CREATE INDEX mtrag_rel_{low}_rel_id IF NOT EXISTS FOR ()-[r:{t}]-() ON (r.rel_id)")
            stmts.append(f"CREATE INDEX mtrag_rel_{low}_projection IF NOT EXISTS FOR ()-[r:{t}]-() ON (r.projection)")
        for s in stmts:
            try:
                self._write(s)
            except ClientError as exc:
                # Two partitions building in parallel both found the rule missing; one created it.
                if exc.code != "Neo.ClientError.Schema.EquivalentSchemaRuleAlreadyExists":
                    raise
        self._write("CALL db.awaitIndexes(300)")

    # ------------------------------------------------------------------------------- markers
    def _set_marker(self, source_id: str, generation: str, state: str) -> None:
        self._write("MERGE (m:ProjectionMarker {source_id: $sid}) "
                    "SET m.generation = $gen, m.state = $state, m.updated_at = datetime()",
                    sid=source_id, gen=generation, state=state)

    def marker(self, source_id: str) -> Marker | None:
        rows = self._read("MATCH (m:ProjectionMarker {source_id: $sid}) "
                          "RETURN m.source_id AS source_id, m.generation AS generation, m.state AS state",
                          sid=source_id)
        return Marker(**rows[0]) if rows else None

    def markers(self) -> dict[str, Marker]:
        rows = self._read("MATCH (m:ProjectionMarker) "
                          "RETURN m.source_id AS source_id, m.generation AS generation, m.state AS state")
        return {r["source_id"]: Marker(**r) for r in rows}

    # -------------------------------------------------------------------------------- writes
    def write_source(self, source_id: str, generation: str, nodes: list[GraphNode],
                     relations: list[GraphRelation], chunks: list[dict],
                     progress: Callable[[str, int], None] | None = None) -> dict:
        """Project one source: marker 'begin', MERGE nodes / chunk nodes / HAS_CHUNK / relations in
        UNWIND batches, delete what this source owns from any other write, marker 'committed'."""
        if not source_id or source_id == LINKS_SOURCE:
            raise ValueError(f"invalid source id {source_id!r}")
        t0 = time.monotonic()
        write_id = uuid.uuid4().hex
        stamp = {"generation": generation, "write_id": write_id}

        # validate and shape everything before touching the database
        node_rows: dict[str, list[dict]] = defaultdict(list)
        has_chunk_rows: list[dict] = []
        for n in nodes:
            label = check_label(n.label)
            if n.source_id and n.source_id != source_id:
                raise ValueError(f"node {n.node_id!r} has source_id {n.source_id!r}, not {source_id!r}")
            props = {k: getattr(n, k) for k in NODE_PROPS}
            props.update(source_id=source_id, **stamp)
            node_rows[label].append(props)
            if n.chunk_id:
                has_chunk_rows.append({"node_id": n.node_id, "chunk_node_id": chunk_node_id(n.chunk_id),
                                       "rel_id": f"has_chunk:{n.node_id}", "source_id": source_id,
                                       "projection": source_id, **stamp})
        chunk_rows = []
        for c in chunks:
            row = {k: c.get(k) for k in CHUNK_PROPS}
            if not row["chunk_id"]:
                raise ValueError(f"chunk without chunk_id: {c!r}")
            if row["source_id"] and row["source_id"] != source_id:
                raise ValueError(f"chunk {row['chunk_id']!r} has source_id {row['source_id']!r}, not {source_id!r}")
            row.update(node_id=chunk_node_id(row["chunk_id"]), name=row["title"] or row["symbol"],
                       source_id=source_id, **stamp)
            chunk_rows.append(row)
        rel_rows = self._rel_rows(relations, source_id, stamp, default_source=source_id)

        self._set_marker(source_id, generation, BEGIN)
        stats_nodes: Counter = Counter()
        for label, rows in node_rows.items():
            for batch in _batches(rows, self.batch_size):
                self._merge_nodes(label, batch)
                stats_nodes[label] += len(batch)
                if progress:
                    progress(label, len(batch))
        for batch in _batches(chunk_rows, self.batch_size):
            self._merge_nodes("Chunk", batch)
            if progress:
                progress("Chunk", len(batch))
        has_chunk = 0
        for batch in _batches(has_chunk_rows, self.batch_size):
            has_chunk += self._merge_has_chunk(batch)
        rel_stats, skipped = self._merge_relations(rel_rows, progress)
        if has_chunk:
            rel_stats["HAS_CHUNK"] = has_chunk
        skipped["HAS_CHUNK"] = len(has_chunk_rows) - has_chunk

        deleted_rels = self._delete_stale_rels(source_id, write_id)
        deleted_nodes = self._delete_loop(
            "MATCH (n:Entity) WHERE n.source_id = $sid AND n.write_id <> $wid "
            "WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS n", sid=source_id, wid=write_id)
        self._set_marker(source_id, generation, COMMITTED)
        seconds = time.monotonic() - t0
        n_rels = sum(rel_stats.values())
        return {
            "source_id": source_id, "generation": generation,
            "nodes": dict(stats_nodes), "chunks": len(chunk_rows),
            "relationships": dict(rel_stats),
            "skipped_relationships": {k: v for k, v in skipped.items() if v},
            "deleted_nodes": deleted_nodes, "deleted_relationships": deleted_rels,
            "seconds": round(seconds, 3), "rels_per_s": round(n_rels / seconds, 1) if seconds > 0 else None,
        }

    def write_links(self, generation: str, links: list[GraphRelation],
                    progress: Callable[[str, int], None] | None = None) -> dict:
        """Project the cross-source links (doc -> code MENTIONS / IMPLEMENTS, ...) under the marker
        `__links__`. Endpoints are existing node ids (chunk nodes "chunk:<id>", Section nodes, code
        entities); a link whose endpoint is missing is skipped and counted."""
        t0 = time.monotonic()
        write_id = uuid.uuid4().hex
        stamp = {"generation": generation, "write_id": write_id}
        rel_rows = self._rel_rows(links, LINKS_SOURCE, stamp, default_source="")
        self._set_marker(LINKS_SOURCE, generation, BEGIN)
        rel_stats, skipped = self._merge_relations(rel_rows, progress)
        deleted = self._delete_stale_rels(LINKS_SOURCE, write_id)
        self._set_marker(LINKS_SOURCE, generation, COMMITTED)
        seconds = time.monotonic() - t0
        n_rels = sum(rel_stats.values())
        return {
            "source_id": LINKS_SOURCE, "generation": generation, "relationships": dict(rel_stats),
            "skipped_relationships": {k: v for k, v in skipped.items() if v},
            "deleted_relationships": deleted, "seconds": round(seconds, 3),
            "rels_per_s": round(n_rels / seconds, 1) if seconds > 0 else None,
        }

    @staticmethod
    def _rel_rows(relations: list[GraphRelation], projection: str, stamp: dict,
                  default_source: str) -> dict[str, list[dict]]:
        rows: dict[str, list[dict]] = defaultdict(list)
        for r in relations:
            t = check_rel_type(r.rel_type)
            if not r.rel_id or not r.src_id or not r.dst_id:
                raise ValueError(f"relation without rel_id/src_id/dst_id: {asdict(r)!r}")
            props = {k: getattr(r, k) for k in REL_PROPS}
            props["candidates"] = [str(c) for c in (r.candidates or [])]
            props["source_id"] = r.source_id or default_source
            props.update(projection=projection, **stamp)
            rows[t].append({"src_id": r.src_id, "dst_id": r.dst_id, "props": props})
        return rows

    def _merge_nodes(self, label: str, rows: list[dict]) -> None:
        label = check_label(label)
        others = ":".join(lbl for lbl in ALLOWED_LABELS if lbl != label)
        # `SET n = row` replaces all properties (no leftovers from an older shape of the node);
        # removing the other allowlisted labels handles an entity whose kind changed.
        self._run_batch(
            f"UNWIND $rows AS row MERGE (n:Entity {{node_id: row.node_id}}) "
            f"SET n = row REMOVE n:{others} SET n:{label}", rows)

    def _merge_has_chunk(self, rows: list[dict]) -> int:
        res = self._run_batch(
            "UNWIND $rows AS row "
            "MATCH (n:Entity {node_id: row.node_id}) MATCH (c:Entity {node_id: row.chunk_node_id}) "
            "MERGE (n)-[r:HAS_CHUNK]->(c) "
            "SET r.rel_id = row.rel_id, r.source_id = row.source_id, r.projection = row.projection, "
            "r.generation = row.generation, r.write_id = row.write_id, r.confidence = 'VERIFIED' "
            "RETURN count(r) AS n", rows)
        return res[0]["n"] if res else 0

    def _merge_relations(self, rel_rows: dict[str, list[dict]],
                         progress: Callable[[str, int], None] | None) -> tuple[Counter, Counter]:
        written: Counter = Counter()
        skipped: Counter = Counter()
        for t, rows in rel_rows.items():
            t = check_rel_type(t)
            # MERGE finds the edge by rel_id between these endpoints (relationship index seek). A
            # rel_id whose endpoints changed gets a new edge here; the old one keeps its old
            # write_id and goes in the stale removal.
            merge = (f"UNWIND $rows AS row "
                     f"MATCH (a:Entity {{node_id: row.src_id}}) MATCH (b:Entity {{node_id: row.dst_id}}) "
                     f"MERGE (a)-[r:{t} {{rel_id: row.props.rel_id}}]->(b) SET r = row.props "
                     f"RETURN count(r) AS n")
            for batch in _batches(rows, self.batch_size):
                res = self._run_batch(merge, batch)
                n = res[0]["n"] if res else 0
                written[t] += n
                skipped[t] += len(batch) - n
                if progress:
                    progress(t, len(batch))
        return written, skipped

    def _delete_stale_rels(self, projection: str, write_id: str) -> int:
        total = 0
        for t in ALLOWED_REL_TYPES:
            t = check_rel_type(t)
            total += self._delete_loop(
                f"MATCH ()-[r:{t}]->() WHERE r.projection = $p AND r.write_id <> $wid "
                "WITH r LIMIT $limit DELETE r RETURN count(*) AS n", p=projection, wid=write_id)
        return total

    def delete_source(self, source_id: str) -> dict:
        """Remove everything a projection owns (its nodes, its relationships) and its marker."""
        rels = 0
        for t in ALLOWED_REL_TYPES:
            t = check_rel_type(t)
            rels += self._delete_loop(f"MATCH ()-[r:{t}]->() WHERE r.projection = $p "
                                      "WITH r LIMIT $limit DELETE r RETURN count(*) AS n", p=source_id)
        nodes = self._delete_loop("MATCH (n:Entity) WHERE n.source_id = $sid "
                                  "WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS n", sid=source_id)
        self._write("MATCH (m:ProjectionMarker {source_id: $sid}) DELETE m", sid=source_id)
        return {"deleted_nodes": nodes, "deleted_relationships": rels}

    # ----------------------------------------------------------------------------- inspection
    def counts(self, source_id: str) -> dict:
        """Nodes by specific label (Chunk included), relationships by type, chunk node count."""
        nodes = self._read(
            "MATCH (n:Entity) WHERE n.source_id = $sid "
            f"RETURN {_LABEL_EXPR.format(v='n')} AS label, count(*) AS n", sid=source_id)
        rels: dict[str, int] = {}
        for t in ALLOWED_REL_TYPES:
            t = check_rel_type(t)
            n = self._read(f"MATCH ()-[r:{t}]->() WHERE r.projection = $p RETURN count(r) AS n",
                           p=source_id)[0]["n"]
            if n:
                rels[t] = n
        by_label = {r["label"]: r["n"] for r in nodes}
        return {"nodes": by_label, "relationships": rels, "chunks": by_label.get("Chunk", 0),
                "total_nodes": sum(by_label.values()), "total_relationships": sum(rels.values())}

    def database_counts(self) -> dict:
        """All nodes and relationships in the database (every projection, markers included)."""
        n = self._read("MATCH (n) RETURN count(n) AS n")[0]["n"]
        r = self._read("MATCH ()-[r]->() RETURN count(r) AS n")[0]["n"]
        return {"nodes": n, "relationships": r}

    # -------------------------------------------------------------------------------- serving
    def resolve_anchors(self, names: list[str], limit: int = 20) -> list[dict]:
        """Entities (never Chunk nodes) whose node_id, qualified_name or name equals one of `names`:
        exact node_id matches first, then qualified_name, then name."""
        names = [n for n in names if isinstance(n, str) and n]
        if not names:
            return []
        return self._read(
            "MATCH (n:Entity) WHERE (n.node_id IN $names OR n.qualified_name IN $names OR n.name IN $names) "
            "AND NOT n:Chunk "
            "WITH n, CASE WHEN n.node_id IN $names THEN 0 WHEN n.qualified_name IN $names THEN 1 ELSE 2 END AS how "
            f"RETURN n.node_id AS node_id, {_LABEL_EXPR.format(v='n')} AS label, n.name AS name, "
            "n.qualified_name AS qualified_name, n.source_id AS source_id, n.file_path AS file_path, "
            "n.start_line AS start_line, n.end_line AS end_line, n.chunk_id AS chunk_id, "
            "['node_id', 'qualified_name', 'name'][how] AS matched "
            "ORDER BY how, n.qualified_name, n.node_id LIMIT $limit",
            names=names, limit=int(limit))

    def paths(self, from_names: list[str], to_names: list[str] | None = None,
              rel_types: str | Iterable[str] | None = None, direction: str = "out", max_hops: int = 4,
              verified_only: bool = True, limit: int = 10, hard_max_hops: int = 6) -> list[dict]:
        """Simple paths from the entities `from_names` resolves to (to the ones `to_names` resolves
        to, if given) over the allowlisted relationship types, shortest first, each edge with its
        evidence. verified_only: every edge VERIFIED with evidence file and hash."""
        hops = check_hops(max_hops, hard_max_hops)
        types = check_rel_types(rel_types)
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {direction!r} is not one of {DIRECTIONS}")
        limit = int(limit)
        if limit < 1:
            return []
        from_ids = [a["node_id"] for a in self.resolve_anchors(list(from_names), limit=100)]
        if not from_ids:
            return []
        to_ids = None
        if to_names:
            to_ids = [a["node_id"] for a in self.resolve_anchors(list(to_names), limit=100)]
            if not to_ids:
                return []
        type_expr = "|".join(types)
        left, right = {"out": ("-", "->"), "in": ("<-", "-"), "both": ("-", "-")}[direction]
        where = ["all(i IN range(0, size(nodes(p)) - 2) WHERE NOT nodes(p)[i] IN nodes(p)[i + 1..])"]
        if verified_only:
            where.append("all(r IN relationships(p) WHERE " + _VERIFIED_PRED.format(r="r") + ")")
        if to_ids is not None:
            where.append("b.node_id IN $to_ids AND NOT b.node_id IN $from_ids")
        out: list[dict] = []
        # shortest first: one bounded, lazily evaluated query per hop count, stopping at `limit`
        for h in range(1, hops + 1):
            query = (f"MATCH (a:Entity) WHERE a.node_id IN $from_ids "
                     f"MATCH p = (a){left}[:{type_expr}*{h}..{h}]{right}(b:Entity) "
                     f"WHERE {' AND '.join(where)} "
                     f"WITH p LIMIT $limit "
                     f"RETURN [n IN nodes(p) | {_NODE_MAP.format(v='n')}] AS nodes, "
                     f"[r IN relationships(p) | {_EDGE_MAP.format(r='r')}] AS edges")
            rows = self._read(query, from_ids=from_ids, to_ids=to_ids or [], limit=limit - len(out))
            rows.sort(key=lambda r: [n["node_id"] for n in r["nodes"]])
            for r in rows:
                out.append({"nodes": r["nodes"], "edges": r["edges"], "hops": h})
            if len(out) >= limit:
                break
        return out[:limit]

    def bridge(self, chunk_ids: list[str], rel_types: str | Iterable[str] | None = None,
               verified_only: bool = False, limit: int = 100) -> list[dict]:
        """Doc -> code: from each chunk node (or the entity owning it, e.g. its Section) follow
        MENTIONS / IMPLEMENTS to code entities."""
        chunk_ids = [c for c in chunk_ids if isinstance(c, str) and c]
        if not chunk_ids:
            return []
        types = check_rel_types(rel_types, default=BRIDGE_TYPES)
        pred = (" AND " + _VERIFIED_PRED.format(r="r")) if verified_only else ""
        return self._read(
            "UNWIND $cids AS cid MATCH (c:Chunk {chunk_id: cid}) "
            "OPTIONAL MATCH (owner:Entity)-[:HAS_CHUNK]->(c) "
            "WITH cid, c, collect(DISTINCT owner) AS owners "
            "UNWIND owners + [c] AS f "
            f"MATCH (f)-[r:{'|'.join(types)}]->(t:Entity) WHERE NOT t:Chunk{pred} "
            "WITH cid, t, r ORDER BY CASE r.confidence WHEN 'VERIFIED' THEN 0 ELSE 1 END, r.rel_id "
            "WITH cid, t, type(r) AS rel, collect(r)[0] AS r "
            "RETURN cid AS from_chunk_id, t.qualified_name AS symbol, t.node_id AS node_id, "
            f"{_LABEL_EXPR.format(v='t')} AS label, t.source_id AS source_id, "
            "t.file_path AS file_path, t.start_line AS start_line, rel AS relation, "
            "r.confidence AS confidence, "
            "{file: r.evidence_file, start_line: r.evidence_start, end_line: r.evidence_end, "
            "hash: r.evidence_hash, text: r.evidence_text} AS evidence "
            "ORDER BY from_chunk_id, CASE confidence WHEN 'VERIFIED' THEN 0 ELSE 1 END, symbol LIMIT $limit",
            cids=chunk_ids, limit=int(limit))
