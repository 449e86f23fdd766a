"""Neo4j projection throughput: project ~20,000 synthetic relationships (plus one HAS_CHUNK per
function) for one source and report relationships per second for

- first_write:        a fresh source (nothing of it in the graph yet),
- unchanged_rewrite:  the same input again (same generation),
- changed_10pct:      a new generation where 10% of the functions were renamed (their nodes, chunk
                      nodes and every relationship touching them change: stale removal included),
- small_write:        a fresh small source of ~1,500 relationships (the size of a real build of click),
                      as wall time, and small_unchanged its unchanged rewrite,

each repeated --repeat times (the source is deleted before every first write); medians are reported.
rels/s counts every relationship the write leaves projected (HAS_CHUNK included) over the wall time
of `write_source`, whether the store had to write it or found it unchanged. Each run also reports the
CPU seconds of this process and (local server only) of the server, which vary much less than wall
time on a shared machine.

    python bench/neo4j_projection.py [--rels 20000] [--nodes 5000] [--repeat 3] [--fresh] [--out FILE]

Uses NEO4J_URI when set, else the local server of $MTRAG_HOME (started if needed, and stopped again
afterwards when this script started it, unless --keep). --fresh starts a private server under a
temporary home instead (cold JVM, empty database, no query plans cached) and removes it afterwards."""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrag_resources.core.config import Settings  # noqa: E402
from mtrag_resources.core.models import GraphNode, GraphRelation, sha256_hex  # noqa: E402
from mtrag_resources.stores.neo4j_server import Neo4jServer, jit_flags, neo4j_connection  # noqa: E402
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


def _server_cpu(pid: int | None) -> float | None:
    """CPU seconds (all threads) the local server process has used, or None."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _run(store: Neo4jStore, source: str, generation: str, graph, server_pid: int | None = None) -> dict:
    """One write_source, timed: wall seconds, plus the CPU seconds of this process and of the local
    server (less noisy than wall time on a shared machine)."""
    nodes, rels, chunks = graph
    s0, c0, t = _server_cpu(server_pid), time.process_time(), time.monotonic()
    stats = store.write_source(source, generation, nodes, rels, chunks)
    wall = time.monotonic() - t
    client_cpu, s1 = time.process_time() - c0, _server_cpu(server_pid)
    projected = sum(stats["relationships"].values())
    out = {"seconds": round(wall, 3), "rels_per_s": round(projected / wall, 1), "projected_relationships": projected,
           "client_cpu_s": round(client_cpu, 3),
           "server_cpu_s": round(s1 - s0, 3) if s0 is not None and s1 is not None else None}
    for k in ("written_relationships", "created_relationships", "updated_relationships", "unchanged_relationships",
              "deleted_nodes", "deleted_relationships", "skipped_relationships", "written_nodes",
              "unchanged_nodes", "transactions"):
        if k in stats:
            out[k] = stats[k]
    return out


def _summary(runs: list[dict]) -> dict:
    out = {"median_seconds": round(statistics.median(r["seconds"] for r in runs), 3),
           "median_rels_per_s": round(statistics.median(r["rels_per_s"] for r in runs), 1),
           "median_client_cpu_s": round(statistics.median(r["client_cpu_s"] for r in runs), 3)}
    if all(r["server_cpu_s"] is not None for r in runs):
        out["median_server_cpu_s"] = round(statistics.median(r["server_cpu_s"] for r in runs), 3)
    out["runs"] = runs
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rels", type=int, default=20000)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--small-rels", type=int, default=1500)
    ap.add_argument("--small-nodes", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=None, help="rows per transaction (default: the store's)")
    ap.add_argument("--source", default="bench-neo4j-projection")
    ap.add_argument("--fresh", action="store_true", help="start a private server under a temporary home")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the data and a server this script started")
    args = ap.parse_args(argv)

    tmp_home = None
    if args.fresh:
        tmp_home = Path(tempfile.mkdtemp(prefix="mtrag-bench-neo4j-"))
        settings = Settings(home=tmp_home)
    else:
        settings = Settings.from_env()
    server = Neo4jServer(settings)
    started_here = False
    t0 = time.monotonic()
    if args.fresh:
        uri, user, password = server.start(timeout=300), None, None
        started_here = True
    else:
        try:
            uri, user, password = neo4j_connection(settings)
        except Exception:  # noqa: BLE001 - not running: start the local one
            uri, user, password = neo4j_connection(settings, start=True)
            started_here = True
    server_start_s = round(time.monotonic() - t0, 2)

    server_pid = None if os.environ.get("NEO4J_URI") else server._pid()
    kwargs = {"batch_size": args.batch} if args.batch else {}
    store = Neo4jStore(uri, user, password, **kwargs)
    small_source = args.source + "-small"
    runs: dict[str, list[dict]] = {k: [] for k in ("first_write", "unchanged_rewrite", "changed_10pct",
                                                   "small_write", "small_unchanged")}
    try:
        t = time.monotonic()
        store.ensure_schema()
        schema_first_s = time.monotonic() - t
        t = time.monotonic()
        store.ensure_schema()
        schema_again_s = time.monotonic() - t
        big = synthetic(args.source, args.nodes, args.rels, seed=1)
        renamed = set(random.Random(2).sample(range(args.nodes), args.nodes // 10))
        big2 = synthetic(args.source, args.nodes, args.rels, seed=1, renamed=renamed)
        small = synthetic(small_source, args.small_nodes, args.small_rels, seed=3)
        for i in range(args.repeat):
            store.delete_source(small_source)
            runs["small_write"].append(_run(store, small_source, f"s-{i}", small, server_pid))
            runs["small_unchanged"].append(_run(store, small_source, f"s-{i}", small, server_pid))
            store.delete_source(args.source)
            runs["first_write"].append(_run(store, args.source, f"gen-{i}-1", big, server_pid))
            runs["unchanged_rewrite"].append(_run(store, args.source, f"gen-{i}-1", big, server_pid))
            runs["changed_10pct"].append(_run(store, args.source, f"gen-{i}-2", big2, server_pid))
            for k in runs:
                r = runs[k][-1]
                print(f"[{i}] {k:20s} {r['projected_relationships']:7d} rels in {r['seconds']:7.3f} s "
                      f"= {r['rels_per_s']:9.1f} rels/s  written={r.get('written_relationships', '?')} "
                      f"deleted={r['deleted_nodes']} nodes/{r['deleted_relationships']} rels  "
                      f"cpu client {r['client_cpu_s']:.2f} s server {r['server_cpu_s']} s", flush=True)
        counts = store.counts(args.source)
        marker = store.marker(args.source)
        if not args.keep:
            store.delete_source(args.source)
            store.delete_source(small_source)
    finally:
        store.close()
        if started_here and not args.keep:
            server.stop()
        if tmp_home is not None and not args.keep:
            shutil.rmtree(tmp_home, ignore_errors=True)

    result = {
        "server": "NEO4J_URI" if os.environ.get("NEO4J_URI") else ("fresh" if args.fresh else "local"),
        "server_start_s": server_start_s if started_here else None,
        "server_jit_flags": jit_flags() if started_here else None,
        "schema_first_s": round(schema_first_s, 3), "schema_again_s": round(schema_again_s, 3),
        "batch_size": store.batch_size, "repeat": args.repeat,
        "input": {"nodes": len(big[0]), "relationships": len(big[1]), "chunks": len(big[2]),
                  "small_relationships": len(small[1]), "small_chunks": len(small[2])},
        "runs": {k: _summary(v) for k, v in runs.items()},
        "final_counts": counts, "marker": marker.__dict__ if marker else None,
    }
    print(f"schema: first {result['schema_first_s']} s, again {result['schema_again_s']} s")
    for k, v in result["runs"].items():
        print(f"{k:20s} median {v['median_seconds']:7.3f} s = {v['median_rels_per_s']:9.1f} rels/s  "
              f"(cpu: client {v['median_client_cpu_s']:.2f} s, server {v.get('median_server_cpu_s')} s)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
