"""Neo4j projection throughput: write ~20,000 synthetic relationships for one source and report
relationships per second for a first write, an idempotent rewrite (same generation) and a new
generation where 10% of the functions changed (stale removal included).

    python bench/neo4j_projection.py [--rels 20000] [--nodes 5000] [--batch 2000] [--out bench/out/neo4j.json]

Uses NEO4J_URI when set, else the local server of $MTRAG_HOME (started if needed, and stopped again
afterwards when this script started it, unless --keep)."""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrag_resources.config import Settings  # noqa: E402
from mtrag_resources.models import GraphNode, GraphRelation, sha256_hex  # noqa: E402
from mtrag_resources.neo4j_server import Neo4jServer, neo4j_connection  # noqa: E402
from mtrag_resources.stores.neo4j_store import Neo4jStore  # noqa: E402


def synthetic(source_id: str, n_nodes: int, n_rels: int, seed: int, renamed: set[int] = frozenset()):
    rnd = random.Random(seed)
    n_files = max(1, n_nodes // 20)
    nodes, chunks, rels = [], [], []
    for f in range(n_files):
        nodes.append(GraphNode(node_id=f"{source_id}:file{f}", label="File", name=f"mod{f}.py",
                               qualified_name=f"pkg.mod{f}", source_id=source_id, file_path=f"pkg/mod{f}.py"))
    fn_ids = []
    for i in range(n_nodes):
        name = f"fn{i}_v2" if i in renamed else f"fn{i}"
        nid = f"{source_id}:{name}"
        f = i % n_files
        cid = f"{source_id}-chunk-{name}"
        nodes.append(GraphNode(node_id=nid, label="Function", name=name, qualified_name=f"pkg.mod{f}.{name}",
                               source_id=source_id, file_path=f"pkg/mod{f}.py", start_line=i, end_line=i + 9,
                               chunk_id=cid, content_hash=sha256_hex(name)))
        chunks.append({"chunk_id": cid, "source_id": source_id, "role": "child", "chunk_type": "function",
                       "file_path": f"pkg/mod{f}.py", "symbol": f"pkg.mod{f}.{name}", "title": name,
                       "start_line": i, "end_line": i + 9, "parent_id": f"{source_id}-file-{f}"})
        fn_ids.append(nid)
        rels.append(GraphRelation(rel_id=f"{source_id}:defines:{nid}", rel_type="DEFINES",
                                  src_id=f"{source_id}:file{f}", dst_id=nid, evidence_file=f"pkg/mod{f}.py",
                                  evidence_start=i, evidence_end=i, evidence_hash=sha256_hex(nid),
                                  evidence_text=f"def {name}(", source_id=source_id))
    while len(rels) < n_rels:
        a, b = rnd.randrange(n_nodes), rnd.randrange(n_nodes)
        if a == b:
            continue
        verified = rnd.random() < 0.8
        rels.append(GraphRelation(
            rel_id=f"{source_id}:call:{fn_ids[a]}->{fn_ids[b]}:{len(rels)}", rel_type="CALLS",
            src_id=fn_ids[a], dst_id=fn_ids[b], confidence="VERIFIED" if verified else "INFERRED",
            candidates=[] if verified else [f"pkg.x{b}", f"pkg.y{b}"], evidence_file="pkg/x.py",
            evidence_start=a, evidence_end=a, evidence_hash=sha256_hex(f"{a}:{b}"),
            evidence_text=f"fn{b}(...)", source_id=source_id))
    return nodes, rels, chunks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rels", type=int, default=20000)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--source", default="bench-neo4j-projection")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the data and a server this script started")
    args = ap.parse_args(argv)

    settings = Settings.from_env()
    server = Neo4jServer(settings)
    started_here = False
    t0 = time.monotonic()
    try:
        uri, user, password = neo4j_connection(settings)
    except Exception:  # noqa: BLE001 - not running: start the local one
        uri, user, password = neo4j_connection(settings, start=True)
        started_here = True
    server_start_s = round(time.monotonic() - t0, 2)

    store = Neo4jStore(uri, user, password, batch_size=args.batch)
    try:
        t = time.monotonic()
        store.ensure_schema()
        schema_s = time.monotonic() - t
        store.delete_source(args.source)
        nodes, rels, chunks = synthetic(args.source, args.nodes, args.rels, seed=1)
        runs = {}
        runs["first_write"] = store.write_source(args.source, "gen-1", nodes, rels, chunks)
        runs["idempotent_rewrite"] = store.write_source(args.source, "gen-1", nodes, rels, chunks)
        renamed = set(random.Random(2).sample(range(args.nodes), args.nodes // 10))
        nodes2, rels2, chunks2 = synthetic(args.source, args.nodes, args.rels, seed=1, renamed=renamed)
        runs["new_generation_10pct_renamed"] = store.write_source(args.source, "gen-2", nodes2, rels2, chunks2)
        counts = store.counts(args.source)
        marker = store.marker(args.source)
        if not args.keep:
            store.delete_source(args.source)
    finally:
        store.close()
        if started_here and not args.keep:
            server.stop()

    result = {
        "server": "NEO4J_URI" if os.environ.get("NEO4J_URI") else "local",
        "server_start_s": server_start_s if started_here else None,
        "schema_s": round(schema_s, 2), "batch_size": args.batch,
        "input": {"nodes": len(nodes), "relationships": len(rels), "chunks": len(chunks)},
        "runs": {k: {kk: v[kk] for kk in ("seconds", "rels_per_s", "relationships", "deleted_nodes",
                                          "deleted_relationships", "skipped_relationships")}
                 for k, v in runs.items()},
        "final_counts": counts, "marker": marker.__dict__ if marker else None,
    }
    for k, v in result["runs"].items():
        n = sum(v["relationships"].values())
        print(f"{k:32s} {n:7d} rels in {v['seconds']:7.2f} s = {v['rels_per_s']:9.1f} rels/s"
              f"  (deleted {v['deleted_nodes']} nodes, {v['deleted_relationships']} rels)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
