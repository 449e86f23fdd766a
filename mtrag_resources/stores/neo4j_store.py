"""The Neo4j projection of the canonical graph, and the graph queries the serving side needs.

This is the ONLY module that builds Cypher. Labels, relationship types and hop bounds are the only
things interpolated into query text, and only after validation against the allowlists below (hop
bounds are ints); every user string (names, ids, source ids, generations) goes as a parameter.
A write sends only the difference from what its projection holds, bracketed by a marker; the
model: docs/incremental.md#the-neo4j-projection.
"""
from __future__ import annotations

from hashlib import blake2b as _blake2b
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from mtrag_resources.stores.neo4j_driver import ClientError, GraphDatabase, RoutingControl

from mtrag_resources.core.faults import fault_point
from mtrag_resources.core.models import GraphNode, GraphRelation
from mtrag_resources.stores.contract import BEGIN, COMMITTED, LINKS_SOURCE, Marker

ALLOWED_LABELS = ("Source", "File", "Module", "Class", "Function", "Method", "Page", "Section", "Endpoint",
                  "Issue", "Chunk")
ALLOWED_REL_TYPES = ("CONTAINS", "DEFINES", "IMPORTS", "INHERITS", "CALLS", "ROUTES_TO", "MENTIONS", "IMPLEMENTS",
                     "REFERENCES", "HAS_CHUNK")
# relations a path query follows when the caller names none (HAS_CHUNK is bookkeeping, not a relation)
DEFAULT_PATH_TYPES = ("CONTAINS", "DEFINES", "IMPORTS", "INHERITS", "CALLS", "ROUTES_TO", "MENTIONS", "IMPLEMENTS",
                      "REFERENCES")
BRIDGE_TYPES = ("MENTIONS", "IMPLEMENTS")
DIRECTIONS = ("out", "in", "both")
VERIFIED = "VERIFIED"

BATCH_SIZE = 2000       # rows per write transaction (fewer live rows per transaction: less of the server's GC)
WRITERS = 2             # concurrent transactions of a bulk create (see Neo4jStore._run_transactions)
STATEMENT_ROWS = 2000   # rows per UNWIND statement; a transaction's statements are pipelined
DELETE_BATCH = 10000
WARM_UP_SAMPLE = 200  # rows per statement of warm_up's rehearsal (_rehearse)

# What a row sends, in order (rows go as lists, not maps: half the encoding work on both ends).
# Constant values (the source id of nodes, a relationship's projection) go as parameters.
NODE_FIELDS = ("node_id", "name", "qualified_name", "file_path", "start_line", "end_line", "chunk_id",
               "content_hash")
CHUNK_FIELDS = ("node_id", "chunk_id", "role", "chunk_type", "file_path", "symbol", "title", "start_line",
                "end_line", "parent_id", "name")
# An Issue node's own properties (GraphNode.properties, ingest/issues.py), after NODE_FIELDS; a
# missing one is null (not set).
ISSUE_FIELDS = ("key", "number", "title", "state", "labels", "author", "created_at", "updated_at", "closed_at",
                "url", "is_pull_request", "issue_type")
_LABEL_FIELDS = {"Issue": ISSUE_FIELDS}
REL_FIELDS = ("rel_id", "confidence", "candidates", "evidence_file", "evidence_start", "evidence_end",
              "evidence_hash", "evidence_text", "source_id")  # after src_id, dst_id

CHUNK_NODE_PREFIX = "chunk:"
# What creating a rule says when a parallel writer (two partitions building at once) made it first.
_EQUIVALENT_RULE = "Neo.ClientError.Schema.EquivalentSchemaRuleAlreadyExists"

# The write path's queries have one sensible plan each, pinned by `USING INDEX SEEK` hints (left
# a choice, the planner was seen scanning the whole node_id index once per row, or seeking the
# projection index and filtering every edge of the projection once per row: seconds to minutes),
# so they also keep the plan they got: a replan (Neo4j replans when the statistics drift, i.e. all
# the time while a graph is being built) costs up to seconds of CPU and could only pick a worse plan.
_KEEP_PLAN = "CYPHER replan=skip "
# How a node CREATE statement ends: the created nodes' internal ids, in the order of its rows, so
# that the relationships between them are created without index seeks (_merge_relations). An id
# names its node while the node exists (ids of deleted nodes are reused): they are used within the
# write that created them only.
_RETURN_IDS = "RETURN collect(id(n)) AS ids"


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


def _label_values(label: str, node: GraphNode) -> list:
    """The values of a node's label-specific properties (`_LABEL_FIELDS`), from its `properties`
    JSON: strings, numbers, booleans, lists of strings; anything else is left out (null)."""
    try:
        props = json.loads(node.properties) if node.properties else {}
    except ValueError:
        raise ValueError(f"node {node.node_id!r}: properties are not JSON") from None
    if not isinstance(props, dict):
        raise ValueError(f"node {node.node_id!r}: properties are not a JSON object")
    out = []
    for name in _LABEL_FIELDS[label]:
        v = props.get(name)
        if isinstance(v, list):
            v = [str(x) for x in v if isinstance(x, (str, int, float))]
        elif not isinstance(v, (str, int, float, bool)):
            v = None
        out.append(v)
    return out


def _digest(kind: str, row: list) -> int:
    """A stable, non-zero, signed 64-bit digest of a row of plain values (str, int, float, bool,
    None, lists of them) and what it is written as (label or type, owner)."""
    d = int.from_bytes(_blake2b((kind + repr(row)).encode(), digest_size=8).digest(), "big", signed=True)
    return d or 1  # 0 stands for "no digest" (a row an older version of this module wrote)


@dataclass
class _Plan:
    """What a projection write deletes and writes (see Neo4jStore._apply)."""
    stale_nodes: list = field(default_factory=list)
    upserts: dict = field(default_factory=lambda: defaultdict(list))    # label -> rows, MERGEd
    new_nodes: dict = field(default_factory=lambda: defaultdict(list))  # label -> rows, CREATEd
    drop_rels: dict = field(default_factory=lambda: defaultdict(list))     # type -> rel_ids gone
    replace_rels: dict = field(default_factory=lambda: defaultdict(list))  # type -> rel_ids rewritten
    creates: dict = field(default_factory=lambda: defaultdict(list))  # (type, replaces) -> edge rows
    unchanged: Counter = field(default_factory=Counter)
    unchanged_nodes: int = 0


@dataclass
class _WriteStats:
    """What the write transactions of one projection write did."""
    created: Counter = field(default_factory=Counter)    # relationships by type, new rel_id
    updated: Counter = field(default_factory=Counter)    # relationships by type, rel_id replaced
    attempted: Counter = field(default_factory=Counter)  # relationship rows sent, by type
    deleted_rels: int = 0
    deleted_nodes: int = 0
    written_nodes: int = 0
    transactions: int = 0
    created_ids: dict = field(default_factory=dict)  # node_id -> internal id, of the nodes CREATEd


def _props_map(fields: Sequence[str], const: dict[str, str], offset: int = 0) -> str:
    """`{field: row[i], ..., const: $param, digest: row[last]}`: the property map of a list row."""
    items = [f"{f}: row[{i + offset}]" for i, f in enumerate(fields)]
    items += [f"{k}: {v}" for k, v in const.items()]
    items.append(f"digest: row[{len(fields) + offset}]")
    return "{" + ", ".join(items) + "}"


# A node's specific label, as a Cypher expression (labels(n) minus Entity).
_LABEL_EXPR = "head([l IN labels({v}) WHERE l <> 'Entity'])"
_NODE_MAP = ("{{node_id: {v}.node_id, label: " + _LABEL_EXPR + ", name: {v}.name, "
             "qualified_name: {v}.qualified_name, file_path: {v}.file_path, start_line: {v}.start_line, "
             "source_id: {v}.source_id}}")
_EDGE_MAP = ("{{type: type({r}), rel_id: {r}.rel_id, from: startNode({r}).node_id, to: endNode({r}).node_id, "
             "confidence: {r}.confidence, candidates: {r}.candidates, "
             "evidence: {{file: {r}.evidence_file, start_line: {r}.evidence_start, end_line: {r}.evidence_end, "
             "hash: {r}.evidence_hash, text: {r}.evidence_text}}}}")
_VERIFIED_PRED = ("{r}.confidence = 'VERIFIED' AND coalesce({r}.evidence_file, '') <> '' "
                  "AND coalesce({r}.evidence_hash, '') <> ''")


class Neo4jStore:
    """Owns one driver. Write methods are idempotent and marker-bracketed; read methods are read-only."""

    def __init__(self, uri: str, user: str | None = None, password: str | None = None,
                 database: str | None = None, batch_size: int = BATCH_SIZE, writers: int = WRITERS,
                 **driver_config):
        """`driver_config`: extra neo4j driver settings (a reader passes short retry times)."""
        auth = (user, password or "") if user else None
        self.uri = uri
        self.database = database
        self.batch_size = max(1, int(batch_size))
        self.writers = max(1, int(writers))
        # no server notifications: they only warn about property keys a fresh database lacks yet
        self._driver = GraphDatabase.driver(uri, auth=auth, notifications_min_severity="OFF", **driver_config)

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

    def _session(self):
        return self._driver.session(database=self.database)

    def _run_batch(self, session, statements: list[tuple[str, dict]]) -> list:
        """One write transaction (retried by the driver on transient errors) running `statements`
        in order, pipelined: each statement is sent before the earlier ones' results are awaited,
        so the client encodes the next batch while the server runs the previous one. Returns each
        statement's summary counters. Tests patch this to inject failures."""
        def work(tx):
            results = [tx.run(query, params) for query, params in statements]
            return [(r.single(strict=True)[0], r.consume().counters) if q.endswith(_RETURN_IDS) else
                    r.consume().counters for (q, _), r in zip(statements, results)]

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
    @staticmethod
    def _schema_statements() -> dict[str, str]:
        stmts = {
            "mtrag_entity_node_id": "CREATE CONSTRAINT mtrag_entity_node_id IF NOT EXISTS "
                                    "FOR (n:Entity) REQUIRE n.node_id IS UNIQUE",
            "mtrag_marker_source": "CREATE CONSTRAINT mtrag_marker_source IF NOT EXISTS "
                                   "FOR (m:ProjectionMarker) REQUIRE m.source_id IS UNIQUE",
            "mtrag_entity_name": "CREATE INDEX mtrag_entity_name IF NOT EXISTS FOR (n:Entity) ON (n.name)",
            "mtrag_entity_qualified_name": "CREATE INDEX mtrag_entity_qualified_name IF NOT EXISTS "
                                           "FOR (n:Entity) ON (n.qualified_name)",
            "mtrag_entity_source_id": "CREATE INDEX mtrag_entity_source_id IF NOT EXISTS FOR (n:Entity) ON (n.source_id)",
            "mtrag_chunk_chunk_id": "CREATE INDEX mtrag_chunk_chunk_id IF NOT EXISTS FOR (c:Chunk) ON (c.chunk_id)",
        }
        for t in ALLOWED_REL_TYPES:
            t = check_rel_type(t)
            low = t.lower()
            stmts[f"mtrag_rel_{low}_rel_id"] = (f"CREATE INDEX mtrag_rel_{low}_rel_id IF NOT EXISTS "
                                                f"FOR ()-[r:{t}]-() ON (r.rel_id)")
            stmts[f"mtrag_rel_{low}_projection"] = (f"CREATE INDEX mtrag_rel_{low}_projection IF NOT EXISTS "
                                                    f"FOR ()-[r:{t}]-() ON (r.projection)")
        return stmts

    def ensure_schema_once(self) -> None:
        """The write queries' index hints need the indexes: ensured once per store object (a kept
        store's flag is reset by connect.open_neo4j when its server is another process)."""
        if not getattr(self, "_schema_ok", False):
            self.ensure_schema()

    def ensure_schema(self) -> dict:
        """Create the constraints and indexes that are missing and wait until they are online. One
        `SHOW INDEXES` when everything exists already (a constraint's backing index has its name)."""
        stmts = self._schema_statements()
        rows = self._read("SHOW INDEXES YIELD name, state RETURN name, state")
        state = {r["name"]: r["state"] for r in rows}
        missing = [name for name in stmts if name not in state]
        if missing:
            self._create_rules([stmts[name] for name in missing])
        if missing or any(state.get(name) != "ONLINE" for name in stmts):
            self._write("CALL db.awaitIndexes(300)")
        self._schema_ok = True
        return {"created": missing}

    def _create_rules(self, statements: list[str]) -> None:
        """The rules in one transaction, which a just-started JVM applies faster than one by one,
        and a fresh home's first write waits on them. Where a
        parallel writer (two partitions building at once) made one of them first, one by one."""
        try:
            with self._session() as session:
                session.execute_write(lambda tx: [tx.run(q).consume() for q in statements])
        except ClientError as exc:
            if exc.code != _EQUIVALENT_RULE:
                raise
            for q in statements:
                try:
                    self._write(q)
                except ClientError as again:
                    if again.code != _EQUIVALENT_RULE:
                        raise

    # ------------------------------------------------------------------------------- markers
    _MARKER = (_KEEP_PLAN + "MERGE (m:ProjectionMarker {source_id: $sid}) "
               "SET m.generation = $gen, m.state = $state, m.updated_at = datetime()")

    def _set_marker(self, source_id: str, generation: str, state: str, session=None) -> None:
        params = {"sid": source_id, "gen": generation, "state": state}
        if session is None:
            self._write(self._MARKER, **params)
        else:
            session.execute_write(lambda tx: tx.run(self._MARKER, params).consume())

    # 'begin' over a marker that committed the base generation, in one statement: the check and the
    # write are one round trip (and nothing else can write the marker between them).
    _BEGIN_FROM = (_KEEP_PLAN + "MATCH (m:ProjectionMarker {source_id: $sid}) "
                   "WHERE m.state = $committed AND m.generation = $base "
                   "SET m.generation = $gen, m.state = $begin, m.updated_at = datetime() RETURN count(m) AS n")

    def _begin_from(self, session, source_id: str, base_generation: str, generation: str) -> bool:
        """Mark `source_id`'s projection 'begin' for `generation` if its marker says it committed
        `base_generation`; whether it did."""
        params = {"sid": source_id, "base": base_generation, "gen": generation, "committed": COMMITTED,
                  "begin": BEGIN}
        return session.execute_write(lambda tx: tx.run(self._BEGIN_FROM, params).single()["n"]) == 1

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
        """Project one source: marker 'begin', read the ids + digests the source has in the graph,
        delete the stale ones, write the new and changed nodes / chunk nodes / HAS_CHUNK / relations
        (unchanged ones are not touched), marker 'committed'. The stats: `relationships` (by type)
        and `nodes` (by label) are what the source holds after the write; `written_relationships`,
        `created_relationships`, `updated_relationships`, `unchanged_relationships`,
        `written_nodes`, `unchanged_nodes`, `deleted_*` and `transactions` what the write did."""
        if not source_id or source_id == LINKS_SOURCE:
            raise ValueError(f"invalid source id {source_id!r}")
        t0 = time.monotonic()
        node_rows, rel_rows, by_label, n_chunks = self._shape(source_id, nodes, relations, chunks)
        stats = self._project(source_id, generation, node_rows, rel_rows, progress)
        seconds = time.monotonic() - t0
        n_rels = sum(stats["relationships"].values())
        return {"source_id": source_id, "generation": generation,
                "nodes": dict(by_label), "chunks": n_chunks, **stats,
                "seconds": round(seconds, 3), "rels_per_s": round(n_rels / seconds, 1) if seconds > 0 else None}

    def _shape(self, source_id: str, nodes: list[GraphNode], relations: list[GraphRelation],
               chunks: list[dict]) -> tuple[dict, dict, Counter, int]:
        """Validate and shape nodes, chunk nodes, HAS_CHUNK and relations into the list rows (with
        their digests) the write statements take, before anything touches the database."""
        node_rows: dict[str, tuple[str, list]] = {}  # node_id -> (label, row); the last one wins, as MERGE did
        has_chunk: list[GraphRelation] = []
        by_label: Counter = Counter()
        for n in nodes:
            label = check_label(n.label)
            if n.source_id and n.source_id != source_id:
                raise ValueError(f"node {n.node_id!r} has source_id {n.source_id!r}, not {source_id!r}")
            if not n.node_id:
                raise ValueError(f"node without node_id: {asdict(n)!r}")
            row = [n.node_id, n.name, n.qualified_name, n.file_path, n.start_line, n.end_line, n.chunk_id,
                   n.content_hash]
            if label in _LABEL_FIELDS:
                row.extend(_label_values(label, n))
            row.append(_digest(f"{label}\x00{source_id}\x00", row))
            node_rows[n.node_id] = (label, row)
            by_label[label] += 1
            if n.chunk_id:
                has_chunk.append(GraphRelation(rel_id=f"has_chunk:{n.node_id}", rel_type="HAS_CHUNK",
                                               src_id=n.node_id, dst_id=chunk_node_id(n.chunk_id),
                                               confidence=VERIFIED, evidence_file=None,
                                               evidence_start=None, evidence_end=None, evidence_hash=None,
                                               evidence_text=None, source_id=source_id))
        n_chunks = 0
        for c in chunks:
            chunk_id = c.get("chunk_id")
            if not chunk_id:
                raise ValueError(f"chunk without chunk_id: {c!r}")
            if c.get("source_id") and c["source_id"] != source_id:
                raise ValueError(f"chunk {chunk_id!r} has source_id {c['source_id']!r}, not {source_id!r}")
            nid = chunk_node_id(chunk_id)
            row = [nid] + [c.get(k) for k in CHUNK_FIELDS[1:-1]] + [c.get("title") or c.get("symbol")]
            row.append(_digest(f"Chunk\x00{source_id}\x00", row))
            node_rows[nid] = ("Chunk", row)
            n_chunks += 1
        rel_rows = self._rel_rows(relations, source_id, default_source=source_id)
        for key, edges in self._rel_rows(has_chunk, source_id, default_source=source_id).items():
            rel_rows.setdefault(key, {}).update(edges)

        return node_rows, rel_rows, by_label, n_chunks

    def write_links(self, generation: str, links: list[GraphRelation],
                    progress: Callable[[str, int], None] | None = None) -> dict:
        """Project the cross-source links (doc -> code MENTIONS / IMPLEMENTS, ...) under the marker
        `__links__`. Endpoints are existing node ids (chunk nodes "chunk:<id>", Section nodes, code
        entities); a link whose endpoint is missing is skipped and counted (and tried again by the
        next write)."""
        t0 = time.monotonic()
        rel_rows = self._rel_rows(links, LINKS_SOURCE, default_source="")
        stats = self._project(LINKS_SOURCE, generation, None, rel_rows, progress)
        for k in ("written_nodes", "unchanged_nodes", "deleted_nodes"):
            stats.pop(k)
        seconds = time.monotonic() - t0
        n_rels = sum(stats["relationships"].values())
        return {"source_id": LINKS_SOURCE, "generation": generation, **stats, "seconds": round(seconds, 3),
                "rels_per_s": round(n_rels / seconds, 1) if seconds > 0 else None}

    def write_links_delta(self, generation: str, base_generation: str, changed: list[GraphRelation],
                          removed: list[tuple[str, str]], expected: dict[str, int],
                          progress: Callable[[str, int], None] | None = None) -> dict | None:
        """Project the links' change since `base_generation` without reading what the projection
        holds: `changed` are the new and changed links (every edge of a changed rel_id), `removed`
        the (type, rel_id) keys that went, `expected` the whole new projection's relationships by
        type. Only when the marker says the links committed `base_generation`; afterwards the
        projection's relationships are counted by type (an index count, no properties read), and
        unless they are `expected` (a link whose endpoint is missing, or an edge a source's DETACH
        DELETE took while the links were not rewritten) it returns None, as it does when the
        marker disagrees: the caller then does the full write_links, which repairs."""
        t0 = time.monotonic()
        rel_rows = self._rel_rows(changed, LINKS_SOURCE, default_source="")
        plan = _Plan()
        for t, rid in removed:
            plan.drop_rels[check_rel_type(t)].append(rid)
        for (t, rid), edges in rel_rows.items():
            plan.replace_rels[t].append(rid)
            plan.creates[(t, True)].extend(edges.values())
        if rel_rows or removed or generation != base_generation:
            with self._session() as session:
                if not self._begin_from(session, LINKS_SOURCE, base_generation, generation):
                    return None
                stats = self._apply(session, LINKS_SOURCE, generation, None, plan, progress)
        else:  # the generation it holds, if its marker says so: nothing to write
            marker = self.marker(LINKS_SOURCE)
            if marker is None or marker.state != COMMITTED or marker.generation != base_generation:
                return None
            stats = _WriteStats()
        held = self.relationship_counts(LINKS_SOURCE)
        if held != {t: n for t, n in expected.items() if n}:
            return None
        out = self._stats(stats, plan, dict(expected))
        for k in ("written_nodes", "unchanged_nodes", "deleted_nodes"):
            out.pop(k)
        return {"source_id": LINKS_SOURCE, "generation": generation, "delta_from": base_generation, **out,
                "seconds": round(time.monotonic() - t0, 3), "rels_per_s": None}

    def relationship_counts(self, projection: str) -> dict[str, int]:
        """The projection's relationships by type (types it has none of left out), counted on the
        relationship-type projection indexes."""
        parts = [f"MATCH ()-[r:{check_rel_type(t)}]->() USING INDEX SEEK r:{t}(projection) "
                 f"WHERE r.projection = $p RETURN '{t}' AS t, count(r) AS n" for t in ALLOWED_REL_TYPES]
        rows = self._read(_KEEP_PLAN + " UNION ALL ".join(parts), p=projection)
        return {r["t"]: r["n"] for r in rows if r["n"]}

    @staticmethod
    def _rel_rows(relations: list[GraphRelation], projection: str,
                  default_source: str) -> dict[tuple[str, str], dict[tuple[str, str], list]]:
        """(type, rel_id) -> (src_id, dst_id) -> row: one edge per rel_id and endpoints, the last one
        winning, as MERGE (a)-[:T {rel_id}]->(b) did."""
        rows: dict[tuple[str, str], dict[tuple[str, str], list]] = {}
        prefixes = {t: f"{t}\x00{projection}\x00" for t in ALLOWED_REL_TYPES}
        for r in relations:
            t, rid, src, dst = r.rel_type, r.rel_id, r.src_id, r.dst_id
            if t not in prefixes:
                check_rel_type(t)  # raises
            if not rid or not src or not dst:
                raise ValueError(f"relation without rel_id/src_id/dst_id: {asdict(r)!r}")
            cands = None if t == "HAS_CHUNK" else ([str(c) for c in r.candidates] if r.candidates else [])
            row = [src, dst, rid, r.confidence, cands, r.evidence_file, r.evidence_start, r.evidence_end,
                   r.evidence_hash, r.evidence_text, r.source_id or default_source]
            row.append(_digest(prefixes[t], row))
            key = (t, rid)
            edges = rows.get(key)
            if edges is None:
                rows[key] = {(src, dst): row}
            else:
                edges[(src, dst)] = row
        return rows

    def _begin(self, session, projection: str, generation: str, source_id: str | None) -> tuple[dict, dict]:
        """Marker 'begin' and, in the same transaction, what the projection holds now: node_id ->
        digest for the source's nodes, and (type, rel_id) -> [digest] for its relationships (digest
        0: a row without one, e.g. written by an older version)."""
        query = self._held_query(with_nodes=source_id is not None)

        def work(tx):
            tx.run(self._MARKER, sid=projection, gen=generation, state=BEGIN)  # pipelined with the read
            return [tuple(rec.values()) for rec in tx.run(query, sid=source_id, p=projection)]

        nodes: dict[str, int] = {}
        rels: dict[tuple[str, str], list[int]] = {}
        for t, ids, ds in session.execute_write(work):
            if not t:
                nodes.update(zip(ids, ds))
            else:
                for rid, d in zip(ids, ds):
                    rels.setdefault((t, rid), []).append(d)
        return nodes, rels

    @staticmethod
    def _held_query(with_nodes: bool) -> str:
        """What a projection holds: its nodes' ids and digests (a source's), its relationships'."""
        parts = []
        if with_nodes:
            parts.append("MATCH (n:Entity) USING INDEX SEEK n:Entity(source_id) WHERE n.source_id = $sid "
                         "RETURN '' AS t, collect(coalesce(n.node_id, '')) AS ids, collect(coalesce(n.digest, 0)) AS ds")
        for t in ALLOWED_REL_TYPES:
            t = check_rel_type(t)
            parts.append(f"MATCH ()-[r:{t}]->() USING INDEX SEEK r:{t}(projection) WHERE r.projection = $p "
                         f"RETURN '{t}' AS t, collect(coalesce(r.rel_id, '')) AS ids, "
                         "collect(coalesce(r.digest, 0)) AS ds")
        return _KEEP_PLAN + " UNION ALL ".join(parts)

    def _project(self, projection: str, generation: str, node_rows: dict[str, tuple[str, list]] | None,
                 rel_rows: dict[tuple[str, str], dict[tuple[str, str], list]],
                 progress: Callable[[str, int], None] | None) -> dict:
        """Diff the wanted nodes/relationships against what the projection holds (one read, with
        the 'begin' marker), then write only the difference (_apply). node_rows None: a projection
        without nodes of its own (the links)."""
        source_id = projection if node_rows is not None else None
        node_rows = node_rows or {}
        self.ensure_schema_once()
        with self._session() as session:
            have_nodes, have_rels = self._begin(session, projection, generation, source_id)
            if source_id:  # a source's projection (not the links)
                fault_point("neo4j:after_begin")
            plan = _Plan()
            plan.stale_nodes = [nid for nid in have_nodes if nid not in node_rows]
            stale_set = set(plan.stale_nodes)
            for nid, (label, row) in node_rows.items():
                old = have_nodes.get(nid)
                if old is None:
                    plan.new_nodes[label].append(row)
                elif old != row[-1]:
                    plan.upserts[label].append(row)
            plan.unchanged_nodes = len(node_rows) - sum(len(v) for v in plan.upserts.values()) - sum(
                len(v) for v in plan.new_nodes.values())
            for t, rid in have_rels:
                if (t, rid) not in rel_rows:
                    plan.drop_rels[t].append(rid)
            for (t, rid), edges in rel_rows.items():
                old = have_rels.get((t, rid))
                if old is not None:
                    want = [row[-1] for row in edges.values()]
                    # unchanged, unless an endpoint is a stale node (its DETACH DELETE takes the edge)
                    if ((old == want or len(old) == len(want) > 1 and sorted(old) == sorted(want))
                            and not any(s in stale_set or d in stale_set for s, d in edges)):
                        plan.unchanged[t] += len(edges)
                        continue
                    plan.replace_rels[t].append(rid)
                plan.creates[(t, old is not None)].extend(edges.values())
            stats = self._apply(session, projection, generation, source_id, plan, progress)
        written = stats.created + stats.updated
        projected = written + plan.unchanged
        return self._stats(stats, plan, {t: projected[t] for t in ALLOWED_REL_TYPES if projected[t]})

    def write_source_delta(self, source_id: str, generation: str, base_generation: str,
                           nodes: list[GraphNode], relations: list[GraphRelation], chunks: list[dict],
                           removed_nodes: list[str], removed_rels: list[tuple[str, str]],
                           totals: dict, progress: Callable[[str, int], None] | None = None) -> dict | None:
        """Project one source's change since `base_generation` without reading what the source
        holds: `nodes`, `chunks` and `relations` are the new and changed ones (a relation with every
        edge of its rel_id), `removed_*` the node ids (chunk nodes as chunk_node_id) and (type,
        rel_id) keys that went. Changed nodes are MERGEd, changed relations replaced by rel_id,
        removed nodes DETACH DELETEd, under the same begin/committed marker as write_source. Only
        when the marker says the projection committed `base_generation` (else None, nothing
        written: the caller does the full write_source). `totals`: {"nodes": by label,
        "relationships": by type} of the whole new projection, for the stats."""
        if not source_id or source_id == LINKS_SOURCE:
            raise ValueError(f"invalid source id {source_id!r}")
        t0 = time.monotonic()
        node_rows, rel_rows, _by_label, n_chunks = self._shape(source_id, nodes, relations, chunks)
        self.ensure_schema_once()
        plan = _Plan()
        plan.stale_nodes = list(removed_nodes)
        for _nid, (label, row) in node_rows.items():
            plan.upserts[label].append(row)  # MERGE: new or changed, the statement is the same
        for t, rid in removed_rels:
            plan.drop_rels[t].append(rid)
        for n in nodes:  # a changed node's HAS_CHUNK goes with it (a new one comes from rel_rows)
            if ("HAS_CHUNK", f"has_chunk:{n.node_id}") not in rel_rows:
                plan.drop_rels["HAS_CHUNK"].append(f"has_chunk:{n.node_id}")
        for (t, rid), edges in rel_rows.items():
            plan.replace_rels[t].append(rid)
            plan.creates[(t, True)].extend(edges.values())
        with self._session() as session:
            if not self._begin_from(session, source_id, base_generation, generation):
                return None
            fault_point("neo4j:after_begin")
            stats = self._apply(session, source_id, generation, source_id, plan, progress)
        out = self._stats(stats, plan, dict(totals.get("relationships", {})))
        out["unchanged_nodes"] = sum(totals.get("nodes", {}).values()) - stats.written_nodes
        seconds = time.monotonic() - t0
        return {"source_id": source_id, "generation": generation, "delta_from": base_generation,
                "nodes": dict(totals.get("nodes", {})), "chunks": n_chunks, **out,
                "seconds": round(seconds, 3), "rels_per_s": None}

    def _apply(self, session, projection: str, generation: str, source_id: str | None, plan: "_Plan",
               progress: Callable[[str, int], None] | None) -> "_WriteStats":
        """Write a plan, in order: delete stale relationships and the old edges of changed
        relationships (by rel_id), stale nodes (by node_id, DETACH); MERGE changed nodes, CREATE new
        ones; CREATE new and changed relationships; the 'committed' marker goes with the last batch."""
        steps: list[tuple[str, list, dict, tuple]] = []
        for kind, drops in (("drop_rel", plan.drop_rels), ("replace_rel", plan.replace_rels)):
            for t, ids in drops.items():
                steps.append((self._drop_rel_statement(t), ids, {"p": projection}, (kind, t)))
        if plan.stale_nodes:
            steps.append((self._DROP_NODES, plan.stale_nodes, {"sid": source_id}, ("drop_node", "")))
        merge_of: dict[str, str] = {}  # CREATE statement -> its MERGE twin (see _execute)
        for kind, groups in (("merge", plan.upserts), ("create", plan.new_nodes)):
            for label, rows in groups.items():
                merge, create, params = self._node_statements(check_label(label))
                if kind == "create":
                    merge_of[create] = merge
                steps.append((create if kind == "create" else merge, rows, {"sid": source_id, **params},
                              ("node", label)))

        stats = _WriteStats()
        commit = (self._MARKER, {"sid": projection, "gen": generation, "state": COMMITTED})
        self._execute(session, steps, stats, progress, merge_of=merge_of)  # deletions and nodes first
        if not self._merge_relations(session, projection, plan.creates, stats, progress, commit):
            self._set_marker(projection, generation, COMMITTED, session)  # nothing went last
        return stats

    @staticmethod
    def _stats(stats: "_WriteStats", plan: "_Plan", relationships: dict) -> dict:
        written = stats.created + stats.updated
        skipped = stats.attempted - written
        return {
            "relationships": relationships,
            "written_relationships": sum(written.values()),
            "created_relationships": dict(stats.created), "updated_relationships": dict(stats.updated),
            "unchanged_relationships": dict(plan.unchanged),
            "skipped_relationships": {k: v for k, v in skipped.items() if v},
            "written_nodes": stats.written_nodes, "unchanged_nodes": plan.unchanged_nodes,
            "deleted_nodes": stats.deleted_nodes, "deleted_relationships": stats.deleted_rels,
            "transactions": stats.transactions,
        }

    @staticmethod
    def _node_statements(label: str) -> tuple[str, str, dict]:
        """(MERGE, CREATE, their parameters) of `label` nodes from list rows. MERGE, for node_ids
        the projection has: `SET n = {...}` replaces all properties (no leftovers from an older
        shape of the node) and removing the other allowlisted labels handles an entity whose kind
        changed. CREATE, for node_ids it does not have: no lookup, no lock on an index entry, no
        label changes, so less server CPU than MERGE (docs/performance.md#neo4j). The
        label goes as a parameter (`$(...)`, Neo4j 5.26): labels of one row shape share one text,
        so one plan (see _CREATE_REL)."""
        fields = CHUNK_FIELDS if label == "Chunk" else NODE_FIELDS + _LABEL_FIELDS.get(label, ())
        props = _props_map(fields, {"source_id": "$sid"})
        params = {"label": label, "others": [lbl for lbl in ALLOWED_LABELS if lbl != label]}
        return (_KEEP_PLAN + f"UNWIND $rows AS row MERGE (n:Entity {{node_id: row[0]}}) SET n = {props} "
                "REMOVE n:$($others) SET n:$($label)",
                _KEEP_PLAN + f"UNWIND $rows AS row CREATE (n:Entity:$($label) {props}) {_RETURN_IDS}", params)

    def _merge_relations(self, session, projection: str, creates: dict[tuple[str, bool], list[list]],
                         stats: "_WriteStats", progress: Callable[[str, int], None] | None,
                         commit: tuple[str, dict]) -> bool:
        """CREATE the new and changed relationships (their endpoints MATCHed by node_id; a row whose
        endpoint is missing creates nothing and counts as skipped); the last transaction also runs
        `commit`. Returns whether some transaction ran it. Endpoints this write CREATEd are found
        by the internal ids their CREATE returned (`stats.created_ids`): a record lookup instead of
        two seeks in the node_id index per row (a first write's bulk)."""
        created_ids = stats.created_ids
        steps = []
        for (t, replaces), rows in creates.items():
            by_id, by_key = [], []
            for row in rows:
                a, b = created_ids.get(row[0]), created_ids.get(row[1])
                if a is None or b is None:
                    by_key.append(row)
                else:
                    by_id.append([a, b, *row[2:]])
            steps += [(statement, group, {"p": projection, "t": check_rel_type(t)}, ("rel", t, replaces))
                      for statement, group in ((self._CREATE_REL_BY_ID, by_id), (self._CREATE_REL, by_key))
                      if group]
        return self._execute(session, steps, stats, progress, last=commit, creates_only=True)

    _DROP_NODES = (_KEEP_PLAN + "UNWIND $rows AS id MATCH (n:Entity {node_id: id}) "
                   "USING INDEX SEEK n:Entity(node_id) WHERE n.source_id = $sid DETACH DELETE n")

    @staticmethod
    def _drop_rel_statement(rel_type: str) -> str:
        t = check_rel_type(rel_type)
        return (_KEEP_PLAN + f"UNWIND $rows AS id MATCH ()-[r:{t} {{rel_id: id}}]->() "
                f"USING INDEX SEEK r:{t}(rel_id) WHERE r.projection = $p DELETE r")

    # CREATE a relationship of type $t (checked; a parameter, Neo4j 5.26's `$(...)`: one text, so
    # one plan, for every type: a statement's first planning is slow on a just-started JVM) per
    # row [src, dst, *REL_FIELDS], its ends found by node_id, or (_BY_ID) by the internal ids
    # their CREATE returned (`_RETURN_IDS`).
    _CREATE_REL_ROW = f"CREATE (a)-[r:$($t) {_props_map(REL_FIELDS, {'projection': '$p'}, offset=2)}]->(b)"
    _CREATE_REL = (_KEEP_PLAN + "UNWIND $rows AS row "
                   "MATCH (a:Entity {node_id: row[0]}) USING INDEX SEEK a:Entity(node_id) "
                   "MATCH (b:Entity {node_id: row[1]}) USING INDEX SEEK b:Entity(node_id) " + _CREATE_REL_ROW)
    _CREATE_REL_BY_ID = (_KEEP_PLAN + "UNWIND $rows AS row MATCH (a) WHERE id(a) = row[0] MATCH (b) WHERE id(b) = row[1] "
                         + _CREATE_REL_ROW)

    def warm_up(self, source_ids: Iterable[str] = ()) -> int:
        """Plan every statement a write sends, each with no rows (nothing is written), so that the
        first change after a server start does not pay their planning (docs/performance.md#neo4j);
        rehearse a change's transactions on what
        `source_ids` and the links hold (_rehearse: rolled back; what they hold comes into the page
        cache); and read the gate's counts. Returns the number of statements."""
        self.ensure_schema_once()
        statements = list(dict.fromkeys([  # distinct texts: labels of one row shape share theirs
            self._DROP_NODES, self._CREATE_REL, self._CREATE_REL_BY_ID,
            *(q for label in ALLOWED_LABELS for q in self._node_statements(label)[:2]),
            *(self._drop_rel_statement(t) for t in ALLOWED_REL_TYPES),
            self._BEGIN_FROM]))  # the begin matches no marker: source id ""

        def work(tx):
            for q in statements:
                tx.run(q, rows=[], p="", sid="", base="", gen="", committed=COMMITTED, begin=BEGIN,
                       label="Entity", others=[], t="CALLS").consume()

        with self._session() as session:
            session.execute_write(work)
            for sid in [*source_ids, LINKS_SOURCE]:
                self._rehearse(session, sid, None if sid == LINKS_SOURCE else sid)
        # ... and the reads of a build: markers, the gate's counts (what each projection holds
        # was read by its rehearsal's 'begin') and the links delta's count of what it holds (each
        # is planned slowly the first time on a just-started server)
        self.marker(LINKS_SOURCE)
        self.relationship_counts(LINKS_SOURCE)
        for sid in source_ids:
            self.counts(sid)
            self.chunk_count(sid)
        return len(statements)

    def _rehearse(self, session, projection: str, source_id: str | None, sample: int = WARM_UP_SAMPLE) -> None:
        """Run the transactions of a change to `projection` as a write runs them (the 'begin'
        marker with the read of what it holds; the drops and MERGEs of existing nodes and
        relationships; the CREATEs with the 'committed' marker), on a sample of what it holds, and
        roll each back: nothing of it stays. After a server start, planning alone left a first
        change's transactions slower than later, and made-up rows did not help; real rows do."""
        def rolled_back(work) -> None:
            tx = session.begin_transaction()
            try:
                work(tx)
            finally:
                tx.rollback()
                tx.close()

        def begin(tx) -> None:
            tx.run(self._MARKER, sid=projection, gen="", state=BEGIN).consume()
            tx.run(self._held_query(with_nodes=source_id is not None), sid=source_id, p=projection).consume()

        rolled_back(begin)
        rels = {t: [(r["row"], r["ids"]) for r in self._read(
            _KEEP_PLAN + f"MATCH (a)-[r:{check_rel_type(t)}]->(b) USING INDEX SEEK r:{t}(projection) "
            "WHERE r.projection = $p WITH a, r, b LIMIT $n "
            "RETURN [a.node_id, b.node_id] + [k IN $fields | r[k]] + [r.digest] AS row, [id(a), id(b)] AS ids",
            p=projection, n=sample, fields=list(REL_FIELDS))] for t in ALLOWED_REL_TYPES}
        nodes = {}
        if source_id is not None:
            for label in ALLOWED_LABELS:
                fields = CHUNK_FIELDS if label == "Chunk" else NODE_FIELDS + _LABEL_FIELDS.get(label, ())
                nodes[label] = [r["row"] for r in self._read(
                    _KEEP_PLAN + f"MATCH (n:Entity) USING INDEX SEEK n:Entity(source_id) WHERE n.source_id = $sid "
                    f"AND n:{check_label(label)} WITH n LIMIT $n RETURN [k IN $fields | n[k]] + [n.digest] AS row",
                    sid=source_id, n=sample, fields=list(fields))]

        def drops_and_nodes(tx) -> None:
            for t, rows in rels.items():
                if rows:
                    tx.run(self._drop_rel_statement(t), rows=[r[2] for r, _ in rows], p=projection).consume()
            for label, rows in nodes.items():
                if rows:
                    merge, _, params = self._node_statements(label)
                    tx.run(merge, rows=rows, sid=source_id, **params).consume()

        def creates(tx) -> None:  # both ways of finding the endpoints (_merge_relations)
            for t, rows in rels.items():
                if rows:
                    tx.run(self._CREATE_REL, rows=[r for r, _ in rows], p=projection, t=t).consume()
                    tx.run(self._CREATE_REL_BY_ID, rows=[ids + r[2:] for r, ids in rows], p=projection,
                           t=t).consume()
            tx.run(self._MARKER, sid=projection, gen="", state=COMMITTED).consume()

        rolled_back(drops_and_nodes)
        rolled_back(creates)

    def _execute(self, session, steps: list[tuple[str, list, dict, tuple]], stats: "_WriteStats",
                 progress: Callable[[str, int], None] | None, last: tuple[str, dict] | None = None,
                 merge_of: dict[str, str] | None = None, creates_only: bool = False) -> bool:
        """Run the steps in packed transactions (see _pack), adding up what they did; `last` (a
        statement) goes with the last transaction. Returns whether there was one to take it.
        `merge_of`: node CREATE statements and their MERGE twins. A node_id the projection did not
        have can still exist, owned by another source (or by none); its CREATE then fails the
        node_id constraint, the transaction rolls back, and it runs again with the MERGEs, which
        take the node over as the MERGE of every node did before."""
        txs = self._pack(steps)

        def run(i: int, tx_steps: list, session) -> list:
            statements = [(q, {**params, "rows": rows}) for q, rows, params, _ in tx_steps]
            if last is not None and i == len(txs) - 1:
                statements.append(last)
            try:
                counters = self._run_batch(session, statements)
            except ClientError as exc:
                if (exc.code != "Neo.ClientError.Schema.ConstraintValidationFailed"
                        or not merge_of or not any(q in merge_of for q, _ in statements)):
                    raise
                statements = [(merge_of.get(q, q), params) for q, params in statements]
                counters = self._run_batch(session, statements)
            fault_point("neo4j:after_batch")  # this transaction has committed, the later ones have not
            return counters

        creates = merge_of or {}  # node CREATE statements; relationship ones: all of `creates_only`
        concurrent = creates_only or all(q in creates for tx in txs[:-1] for q, *_ in tx)
        for tx_steps, counters in self._run_transactions(session, txs, run, concurrent):
            stats.transactions += 1
            for (_, rows, _, tag), c in zip(tx_steps, counters):
                kind, what = tag[0], tag[1]
                if kind == "drop_rel":
                    stats.deleted_rels += c.relationships_deleted
                elif kind == "drop_node":
                    stats.deleted_nodes += c.nodes_deleted
                elif kind == "node":
                    stats.written_nodes += len(rows)
                    if isinstance(c, tuple):  # a CREATE's internal ids, in the order of its rows
                        stats.created_ids.update(zip((row[0] for row in rows), c[0]))
                elif kind == "rel":
                    (stats.updated if tag[2] else stats.created)[what] += c.relationships_created
                    stats.attempted[what] += len(rows)
                if progress and kind in ("node", "rel"):
                    progress(what, len(rows))
        return bool(txs)

    def _run_transactions(self, session, txs: list[list], run: Callable, concurrent: bool):
        """Yield (tx_steps, counters) of each transaction `run(i, tx_steps, session)` ran, in order.
        With `concurrent` (CREATE statements only: a first write's bulk) they run `writers` at a time, each
        in its own session: the server applies one transaction on one core, and one at a time left
        the other cores idle. They touch distinct new nodes or relations;
        two that lock the same endpoint nodes and deadlock are retried by the driver. The last
        transaction (it carries the 'committed' marker) runs after all others have committed; a
        failure stops the ones not yet started and is raised once those running have ended."""
        if not concurrent or self.writers < 2 or len(txs) < 3:
            for i, tx_steps in enumerate(txs):
                yield tx_steps, run(i, tx_steps, session)
            return

        def run_own_session(i: int, tx_steps: list) -> list:
            with self._session() as own:
                return run(i, tx_steps, own)

        with ThreadPoolExecutor(max_workers=self.writers, thread_name_prefix="neo4j-writer") as pool:
            futures = [pool.submit(run_own_session, i, tx_steps) for i, tx_steps in enumerate(txs[:-1])]
            try:
                for tx_steps, future in zip(txs, futures):
                    yield tx_steps, future.result()
            finally:
                for future in futures:
                    future.cancel()
        yield txs[-1], run(len(txs) - 1, txs[-1], session)

    def _pack(self, steps: list[tuple[str, list, dict, tuple]]) -> list[list[tuple[str, list, dict, tuple]]]:
        """Cut the steps' rows into statements of at most STATEMENT_ROWS rows and those into
        transactions of at most batch_size rows, keeping their order (a later statement sees the
        earlier ones' writes, in the same transaction or a committed one)."""
        per_stmt = min(STATEMENT_ROWS, self.batch_size)
        txs: list[list] = []
        cur: list = []
        n = 0
        for query, rows, params, tag in steps:
            i = 0
            while i < len(rows):
                take = min(len(rows) - i, per_stmt, self.batch_size - n)
                cur.append((query, rows[i:i + take], params, tag))
                n += take
                i += take
                if n >= self.batch_size:
                    txs.append(cur)
                    cur, n = [], 0
        if cur:
            txs.append(cur)
        return txs

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

    def chunk_count(self, source_id: str) -> int:
        """The source's chunk nodes (counts()["chunks"] in one query, for the publish gate)."""
        return self._read("MATCH (n:Entity) USING INDEX n:Entity(source_id) WHERE n.source_id = $sid "
                          "AND n:Chunk RETURN count(n) AS n", sid=source_id)[0]["n"]

    def chunk_counts(self, source_ids: list[str]) -> dict[str, int]:
        """chunk_count of several sources in one query (the publish gate reads every source's). A
        label test, not the kind label worked out of labels() as the other reads name it (a node has
        one kind label), which halves the read on a large graph."""
        rows = self._read("MATCH (n:Entity) USING INDEX n:Entity(source_id) WHERE n.source_id IN $sids "
                          "AND n:Chunk RETURN n.source_id AS sid, count(n) AS n",
                          sids=list(source_ids))
        counts = {r["sid"]: r["n"] for r in rows}
        return {sid: counts.get(sid, 0) for sid in source_ids}

    def database_counts(self) -> dict:
        """All nodes and relationships in the database (every projection, markers included)."""
        n = self._read("MATCH (n) RETURN count(n) AS n")[0]["n"]
        r = self._read("MATCH ()-[r]->() RETURN count(r) AS n")[0]["n"]
        return {"nodes": n, "relationships": r}

    # -------------------------------------------------------------------------------- serving
    def resolve_anchors(self, names: list[str], limit: int = 20,
                        source_ids: Sequence[str] | None = None) -> list[dict]:
        """Entities (never Chunk nodes) whose node_id, qualified_name or name equals one of `names`:
        exact node_id matches first, then qualified_name, then name. `source_ids`: only entities
        of these sources (None: every source)."""
        names = [n for n in names if isinstance(n, str) and n]
        if not names or source_ids is not None and not source_ids:
            return []
        in_sources = "" if source_ids is None else "AND n.source_id IN $sids "
        return self._read(
            "MATCH (n:Entity) WHERE (n.node_id IN $names OR n.qualified_name IN $names OR n.name IN $names) "
            f"AND NOT n:Chunk {in_sources}"
            "WITH n, CASE WHEN n.node_id IN $names THEN 0 WHEN n.qualified_name IN $names THEN 1 ELSE 2 END AS how "
            f"RETURN n.node_id AS node_id, {_LABEL_EXPR.format(v='n')} AS label, n.name AS name, "
            "n.qualified_name AS qualified_name, n.source_id AS source_id, n.file_path AS file_path, "
            "n.start_line AS start_line, n.end_line AS end_line, n.chunk_id AS chunk_id, "
            "['node_id', 'qualified_name', 'name'][how] AS matched "
            "ORDER BY how, n.qualified_name, n.node_id LIMIT $limit",
            names=names, limit=int(limit), sids=list(source_ids or []))

    def paths(self, from_names: list[str], to_names: list[str] | None = None,
              rel_types: str | Iterable[str] | None = None, direction: str = "out", max_hops: int = 4,
              verified_only: bool = True, limit: int = 10, hard_max_hops: int = 6,
              source_ids: Sequence[str] | None = None) -> list[dict]:
        """Simple paths from the entities `from_names` resolves to (to the ones `to_names` resolves
        to, if given) over the allowlisted relationship types, shortest first, each edge with its
        evidence. verified_only: every edge VERIFIED with evidence file and hash. `source_ids`:
        only paths whose every node is of these sources, matched so (not filtered afterwards):
        other sources' paths take none of `limit`."""
        hops = check_hops(max_hops, hard_max_hops)
        types = check_rel_types(rel_types)
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {direction!r} is not one of {DIRECTIONS}")
        limit = int(limit)
        if limit < 1:
            return []
        from_ids = [a["node_id"] for a in self.resolve_anchors(list(from_names), limit=100, source_ids=source_ids)]
        if not from_ids:
            return []
        to_ids = None
        if to_names:
            to_ids = [a["node_id"] for a in self.resolve_anchors(list(to_names), limit=100, source_ids=source_ids)]
            if not to_ids:
                return []
        out: list[dict] = []
        # shortest first: one bounded, lazily evaluated query per hop count, stopping at `limit`
        for h in range(1, hops + 1):
            query = self._path_query(h, types, direction, verified_only, with_to=to_ids is not None,
                                     scoped=source_ids is not None)
            rows = self._read(query, from_ids=from_ids, to_ids=to_ids or [], limit=limit - len(out),
                              sids=list(source_ids or []))
            rows.sort(key=lambda r: [n["node_id"] for n in r["nodes"]])
            for r in rows:
                out.append({"nodes": r["nodes"], "edges": r["edges"], "hops": h})
            if len(out) >= limit:
                break
        return out[:limit]

    @staticmethod
    def _path_query(hops: int, types: list[str], direction: str, verified_only: bool, with_to: bool,
                    scoped: bool = False) -> str:
        """The paths of exactly `hops` hops over checked `types` (paths' query for one hop count);
        `scoped`: every node of the path in `$sids`."""
        left, right = {"out": ("-", "->"), "in": ("<-", "-"), "both": ("-", "-")}[direction]
        where = ["all(i IN range(0, size(nodes(p)) - 2) WHERE NOT nodes(p)[i] IN nodes(p)[i + 1..])"]
        if scoped:
            where.append("all(n IN nodes(p) WHERE n.source_id IN $sids)")
        if verified_only:
            where.append("all(r IN relationships(p) WHERE " + _VERIFIED_PRED.format(r="r") + ")")
        if with_to:
            where.append("b.node_id IN $to_ids AND NOT b.node_id IN $from_ids")
        return (f"MATCH (a:Entity) WHERE a.node_id IN $from_ids "
                f"MATCH p = (a){left}[:{'|'.join(types)}*{hops}..{hops}]{right}(b:Entity) "
                f"WHERE {' AND '.join(where)} "
                f"WITH p LIMIT $limit "
                f"RETURN [n IN nodes(p) | {_NODE_MAP.format(v='n')}] AS nodes, "
                f"[r IN relationships(p) | {_EDGE_MAP.format(r='r')}] AS edges")

    def resolved_references(self, texts: list[str], limit: int = 200,
                            source_ids: Sequence[str] | None = None) -> list[dict]:
        """What the links resolved each reference text to wherever the docs make it: the targets of
        the MENTIONS / IMPLEMENTS edges whose evidence is that text (`:func:`~click.echo``), one row
        per text and target, VERIFIED where any such edge is. A pasted doc section's references
        resolved as its build resolved them (module context, re-exports, bases). `source_ids`: only
        targets of these sources."""
        texts = sorted({t for t in texts if isinstance(t, str) and t})
        if not texts or source_ids is not None and not source_ids:
            return []
        in_sources = "" if source_ids is None else " AND t.source_id IN $sids"
        return self._read(
            f"MATCH ()-[r:{'|'.join(BRIDGE_TYPES)}]->(t:Entity) WHERE r.evidence_text IN $texts AND NOT t:Chunk"
            f"{in_sources} "
            "WITH r.evidence_text AS text, t, type(r) AS rel, collect(r.confidence) AS confidences "
            "RETURN text, t.qualified_name AS symbol, t.node_id AS node_id, "
            f"{_LABEL_EXPR.format(v='t')} AS label, t.source_id AS source_id, "
            "t.file_path AS file_path, t.start_line AS start_line, rel AS relation, "
            "CASE WHEN 'VERIFIED' IN confidences THEN 'VERIFIED' ELSE 'INFERRED' END AS confidence "
            "ORDER BY text, symbol LIMIT $limit", texts=texts, limit=int(limit), sids=list(source_ids or []))

    # The graph reads a query makes by default: an exact hit's call paths (reader.py, _query_paths:
    # CALLS, out, 2 hops, verified) and the paths command's defaults (4 hops, every relation).
    SERVING_PATHS = ((("CALLS",), "out", 2), (DEFAULT_PATH_TYPES, "out", 4))

    def warm_serving(self) -> int:
        """Plan the statements a query sends by default (anchors, call paths, the doc -> code bridge),
        each run with nothing to match: a server's plan cache starts empty, and the first query
        that reached the graph after a Neo4j start paid their planning (docs/performance.md#neo4j).
        Reads only; returns the number of statements."""
        self.resolve_anchors(["\x00"])
        self.bridge(["\x00"])
        self.bridge(["\x00"], verified_only=True)
        statements = 3
        for types, direction, hops in self.SERVING_PATHS:
            for h in range(1, hops + 1):
                for with_to in (False, True):
                    self._read(self._path_query(h, list(types), direction, True, with_to),
                               from_ids=[], to_ids=[], limit=1)
                    statements += 1
        return statements

    def bridge(self, chunk_ids: list[str], rel_types: str | Iterable[str] | None = None,
               verified_only: bool = False, limit: int = 100,
               source_ids: Sequence[str] | None = None) -> list[dict]:
        """Doc -> code: from each chunk node (or the entity owning it, e.g. its Section) follow
        MENTIONS / IMPLEMENTS to code entities (`source_ids`: only entities of these sources)."""
        chunk_ids = [c for c in chunk_ids if isinstance(c, str) and c]
        if not chunk_ids or source_ids is not None and not source_ids:
            return []
        types = check_rel_types(rel_types, default=BRIDGE_TYPES)
        pred = (" AND " + _VERIFIED_PRED.format(r="r")) if verified_only else ""
        if source_ids is not None:
            pred += " AND t.source_id IN $sids"
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
            cids=chunk_ids, limit=int(limit), sids=list(source_ids or []))
