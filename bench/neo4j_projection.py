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

With --source-sdist REQ (e.g. `--source-sdist django==5.2.19`) it writes a real source's graph
instead: the sdist's files (--include, default `<name>/**/*.py` and `docs/**/*.txt`) go through
the raw_source, cas_chunks and canonical_graph stages once (no embedding model), cached under
bench/out/neo4j-<name>-<version>/ (--rebuild-graph redoes it), and each round reports

- first_write:        the source deleted, then written (every row new),
- unchanged_rewrite:  the same input again,
- one_file_change:    a new generation where one Python file (--change-file, default the largest
                      one) has a function inserted in its middle, re-parsed by the same stage code:
                      its nodes below the insertion move, new nodes and relationships appear,

with relationships/s and nodes/s; round 1 on a server this script started (--fresh, or the local
one not running yet) is a cold JVM and is shown apart from the medians of the later rounds.
--compare FILE runs another version of neo4j_store.py (e.g. `git show
HEAD:mtrag_resources/stores/neo4j_store.py > /tmp/old_store.py`) in alternation with the current
one on the same server, so the two can be compared within one run on a shared machine.

    python bench/neo4j_projection.py --source-sdist django==5.2.19 [--repeat 3] [--fresh] [--compare FILE]

Uses NEO4J_URI when set, else the local server of $MTRAG_HOME (started if needed, and stopped again
afterwards when this script started it, unless --keep); with --source-sdist it refuses a server that
holds a build of the same source (a home that built django) or another source's nodes with the
graph's node ids, which it would overwrite and then delete. --fresh starts a private server under a
temporary home instead (cold JVM, empty database, no query plans cached) and removes it afterwards."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import inspect
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_s  # noqa: E402
from mtrag_resources.core.config import Settings  # noqa: E402
from mtrag_resources.core.layout import SourceLayout  # noqa: E402
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


def _run(store: Neo4jStore, source: str, generation: str, graph, server_pid: int | None = None) -> dict:
    """One write_source, timed: wall seconds, plus the CPU seconds of this process and of the local
    server (less noisy than wall time on a shared machine)."""
    nodes, rels, chunks = graph
    s0, c0, t = cpu_s(server_pid), time.process_time(), time.monotonic()
    stats = store.write_source(source, generation, nodes, rels, chunks)
    wall = time.monotonic() - t
    client_cpu, s1 = time.process_time() - c0, cpu_s(server_pid)
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


# ------------------------------------------------------------------------------ a real source
CHUNK_NODE_FIELDS = ("chunk_id", "source_id", "role", "chunk_type", "file_path", "symbol", "title",
                     "start_line", "end_line", "parent_id")  # what stages/neo4j_graph.py passes
INSERTED = ("def mtrag_bench_inserted(value, *args):\n"
            "    \"\"\"A function the one-file-change round inserts.\"\"\"\n"
            "    return repr(value), len(args)\n\n")


def sdist_graph(requirement: str, include: list[str], work: Path, source_id: str, rebuild: bool = False):
    """The canonical graph of a pip sdist, built by the stages once (no embedding) and cached under
    `work`: (settings, spec, nodes, relations, chunk rows as stages/neo4j_graph.py passes them)."""
    from mtrag_resources.ingest.sources import SourceSpec
    from mtrag_resources.stages.canonical_graph import build_canonical_graph
    from mtrag_resources.stages.cas_chunks import build_cas_chunks
    from mtrag_resources.stages.raw_source import build_raw_source
    from mtrag_resources.stores.tables import read_rows

    settings = Settings(home=work / "home")
    spec = SourceSpec(id=source_id, kind="code", pip_sdist=requirement, include=tuple(include))
    layout = SourceLayout(settings, source_id)
    stamp = work / "graph.json"  # what the cached graph was built from
    from mtrag_resources.core.versions import CODE_VERSIONS
    want = {"requirement": requirement, "include": list(include), "source_id": source_id,
            "code_versions": {k: CODE_VERSIONS[k] for k in ("raw_source", "cas_chunks", "canonical_graph")}}
    cached = stamp.exists() and json.loads(stamp.read_text()) == want and (layout.relations / "_table.json").exists()
    if rebuild or not cached:
        for stage in (build_raw_source, build_cas_chunks, build_canonical_graph):
            t = time.monotonic()
            result = stage(settings, spec)
            print(f"{stage.__name__}: {time.monotonic() - t:.1f} s "
                  f"{ {k: v for k, v in result.metadata.items() if k in ('files', 'chunks', 'nodes', 'relations')} }",
                  flush=True)
        stamp.write_text(json.dumps(want))
    nodes = read_rows(layout.nodes, GraphNode)
    relations = read_rows(layout.relations, GraphRelation)
    chunks = [{k: r[k] for k in CHUNK_NODE_FIELDS} for r in read_rows(layout.chunks)]
    return settings, spec, nodes, relations, chunks


def one_file_change(settings: Settings, spec, chunks: list[dict], path: str | None):
    """The graph after inserting a function in the middle of one Python file (the largest one when
    `path` is None), re-parsed and re-assembled by the stage code: (path, nodes, relations, chunks)."""
    from mtrag_resources.ingest.snapshot import load_inventory
    from mtrag_resources.stages.canonical_graph import assemble_graph
    from mtrag_resources.stages.cas_chunks import load_parsed_files, parse_file
    from mtrag_resources.stores.cas import ContentStore

    layout = SourceLayout(settings, spec.id)
    entries = {e.path: e for e in load_inventory(layout).included}
    if path is None:
        path = max((e for e in entries.values() if e.language == "python"), key=lambda e: e.size).path
    entry = entries[path]
    lines = ContentStore(settings.cas_dir).get_text(entry.sha256).splitlines(keepends=True)
    # before the first def at or after the middle of the file, at its indentation (a method in a
    # class), so everything below it moves down; at the end when there is none
    at, indent = len(lines), ""
    for i in range(len(lines) // 2, len(lines)):
        m = re.match(r"([ \t]*)(async def|def) ", lines[i])
        if m:
            at, indent = i, m.group(1)
            break
    inserted = "".join(indent + line if line.strip() else line for line in INSERTED.splitlines(keepends=True))
    text = "".join(lines[:at] + [inserted] + lines[at:])
    changed = parse_file(spec.id, path, entry.category, entry.language, text)
    parsed = [(p, changed if p == path else pf) for p, pf in load_parsed_files(layout)]
    if path not in {p for p, _ in parsed}:
        raise RuntimeError(f"{layout.facts}: no parse facts of {path} (another cas_chunks version?): "
                           "run again with --rebuild-graph")
    nodes, relations, _refs = assemble_graph(spec, parsed)
    new_chunks = [c for c in chunks if c["file_path"] != path]
    for c in changed.chunks:
        row = dataclasses.asdict(c)
        row["source_id"] = spec.id
        new_chunks.append({k: row[k] for k in CHUNK_NODE_FIELDS})
    return path, nodes, relations, new_chunks


def load_store_class(path: Path):
    """Neo4jStore from another copy of neo4j_store.py (--compare)."""
    mod_spec = importlib.util.spec_from_file_location("_bench_other_neo4j_store", path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = module  # dataclasses look their module up there
    mod_spec.loader.exec_module(module)
    return module.Neo4jStore


def _timed_write(store, source: str, generation: str, graph, server_pid: int | None) -> dict:
    out = _run(store, source, generation, graph, server_pid)
    nodes = out.get("written_nodes", 0) + out.get("unchanged_nodes", 0)
    out["projected_nodes"] = nodes
    out["nodes_per_s"] = round(nodes / out["seconds"], 1)
    return out


def sdist_rounds(stores: dict, source: str, base, changed, repeat: int, server_pid: int | None,
                 cold_first: bool, compare_first: bool = False) -> dict:
    """`repeat` rounds of first write / unchanged rewrite / one-file change per store, the stores'
    order alternating from round to round (ABBA...), so neither always runs on a warmer server."""
    names = list(stores)[::-1] if compare_first else list(stores)
    runs = {name: {k: [] for k in ("first_write", "unchanged_rewrite", "one_file_change")} for name in names}
    cold: dict = {}
    for i in range(repeat):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            store = stores[name]
            store.delete_source(source)
            got = {"first_write": _timed_write(store, source, f"r{i}-g1", base, server_pid),
                   "unchanged_rewrite": _timed_write(store, source, f"r{i}-g1", base, server_pid),
                   "one_file_change": _timed_write(store, source, f"r{i}-g2", changed, server_pid)}
            if cold_first and not cold:
                cold = {"store": name, **got}  # a cold JVM: reported apart, not in the medians
            else:
                for k, r in got.items():
                    runs[name][k].append(r)
            for k, r in got.items():
                print(f"[{i}] {name:8s} {k:18s} {r['projected_relationships']:6d} rels {r['projected_nodes']:6d} nodes "
                      f"in {r['seconds']:7.3f} s = {r['rels_per_s']:8.1f} rels/s {r['nodes_per_s']:8.1f} nodes/s  "
                      f"written {r.get('written_relationships')} rels / {r.get('written_nodes')} nodes, deleted "
                      f"{r['deleted_relationships']} rels / {r['deleted_nodes']} nodes  cpu client "
                      f"{r['client_cpu_s']:.2f} s server {r['server_cpu_s']} s", flush=True)
    out = {"cold_round": cold or None, "stores": {}}
    for name in names:
        out["stores"][name] = {k: dict(_summary(v), median_nodes_per_s=round(statistics.median(
            r["nodes_per_s"] for r in v), 1)) for k, v in runs[name].items() if v}
    return out


def main_sdist(args) -> int:
    name, version = args.source_sdist.split("==", 1)
    include = args.include or [f"{name}/**/*.py", "docs/**/*.txt"]
    work = args.work or Path(__file__).resolve().parent / "out" / f"neo4j-{name}-{version}"
    work.mkdir(parents=True, exist_ok=True)
    source = name
    t = time.monotonic()
    settings, spec, nodes, rels, chunks = sdist_graph(args.source_sdist, include, work, source, args.rebuild_graph)
    graph_s = time.monotonic() - t
    path, nodes2, rels2, chunks2 = one_file_change(settings, spec, chunks, args.change_file)
    print(f"graph of {args.source_sdist}: {len(nodes)} nodes, {len(rels)} relations, {len(chunks)} chunks "
          f"({graph_s:.1f} s); the one-file change edits {path}", flush=True)

    server, uri, user, password, started_here, tmp_home, server_start_s = _connect(args)
    server_pid = args.server_pid or (server._pid() if args.fresh or not os.environ.get("NEO4J_URI") else None)
    kwargs = _store_settings(args)
    stores = {"current": Neo4jStore(uri, user, password, **kwargs)}
    if args.compare:
        other = load_store_class(args.compare)
        accepted = inspect.signature(other).parameters  # an older store may not take --writers
        stores["compare"] = other(uri, user, password, **{k: v for k, v in kwargs.items() if k in accepted})
    try:
        for store in stores.values():
            store.ensure_schema()
        if not args.fresh:
            _refuse_to_clobber(stores["current"], source, [n.node_id for n in nodes[:500]], uri)
        result = sdist_rounds(stores, source, (nodes, rels, chunks), (nodes2, rels2, chunks2), args.repeat,
                              server_pid, cold_first=started_here, compare_first=args.compare_first)
        counts = stores["current"].counts(source)
        if not args.keep:
            stores["current"].delete_source(source)
    finally:
        for store in stores.values():
            store.close()
        _disconnect(server, started_here, tmp_home, args.keep)

    result = {
        "source": args.source_sdist, "include": include, "changed_file": path,
        "server": "fresh" if args.fresh else ("NEO4J_URI" if os.environ.get("NEO4J_URI") else "local"),
        "server_start_s": server_start_s if started_here else None,
        "server_jit_flags": jit_flags() if started_here else None,
        "compare": str(args.compare) if args.compare else None, "batch_size": stores["current"].batch_size,
        "writers": stores["current"].writers,
        "compare_writers": getattr(stores.get("compare"), "writers", 1) if args.compare else None,
        "repeat": args.repeat,
        "input": {"nodes": len(nodes), "relationships": len(rels), "chunks": len(chunks),
                  "changed": {"nodes": len(nodes2), "relationships": len(rels2), "chunks": len(chunks2)}},
        **result, "final_counts": counts,
    }
    if result["cold_round"]:
        c = result["cold_round"]
        print(f"cold JVM ({c['store']}): first write {c['first_write']['rels_per_s']:.1f} rels/s "
              f"{c['first_write']['nodes_per_s']:.1f} nodes/s in {c['first_write']['seconds']:.2f} s")
    for name, per in result["stores"].items():
        for k, v in per.items():
            print(f"{name:8s} {k:18s} median {v['median_seconds']:7.3f} s = {v['median_rels_per_s']:9.1f} rels/s "
                  f"{v['median_nodes_per_s']:9.1f} nodes/s  (cpu: client {v['median_client_cpu_s']:.2f} s, "
                  f"server {v.get('median_server_cpu_s')} s)")
    out = args.out or work / "result.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")
    return 0


def _refuse_to_clobber(store: Neo4jStore, source: str, node_ids: list[str], uri: str) -> None:
    """Exit before writing when the server holds a build's graph this run would overwrite and then
    delete: the source id itself (a home that built django has a `django` projection), or nodes
    with these ids owned by another source (a node_id is unique: the write takes them over). It
    happened: a run on the django scale home's server cost that home a 14 s rewrite of its graph."""
    marker = store.marker(source)
    if marker is not None and not re.fullmatch(r"r\d+-g\d+", marker.generation or ""):
        raise SystemExit(f"{uri} holds source {source!r} of a build (generation {marker.generation}); this bench "
                         "would overwrite and then delete it: use --fresh (a private server) or a scratch NEO4J_URI")
    owners = store._read("UNWIND $ids AS id MATCH (n:Entity {node_id: id}) WHERE n.source_id <> $sid "
                         "RETURN DISTINCT n.source_id AS sid LIMIT 5", ids=node_ids, sid=source)
    if owners:
        raise SystemExit(f"{uri} holds nodes of {sorted(r['sid'] for r in owners)} with this graph's node ids; "
                         "this bench would take them over and then delete them: use --fresh or a scratch NEO4J_URI")


def _store_settings(args) -> dict:
    """Neo4jStore settings given on the command line (--batch, --writers); the store's defaults otherwise."""
    return {k: v for k, v in (("batch_size", args.batch), ("writers", args.writers)) if v}


def _connect(args):
    """The server to write to: NEO4J_URI, a private fresh one (--fresh), or the local one (started
    when not running). Returns (server, uri, user, password, started_here, tmp_home, start seconds)."""
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
    return server, uri, user, password, started_here, tmp_home, round(time.monotonic() - t0, 2)


def _disconnect(server, started_here: bool, tmp_home: Path | None, keep: bool) -> None:
    if started_here and not keep:
        server.stop()
    if tmp_home is not None and not keep:
        shutil.rmtree(tmp_home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rels", type=int, default=20000)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--small-rels", type=int, default=1500)
    ap.add_argument("--small-nodes", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=None, help="rows per transaction (default: the store's)")
    ap.add_argument("--writers", type=int, default=None,
                    help="concurrent transactions of a bulk create (default: the store's; 1: one at a time)")
    ap.add_argument("--source", default="bench-neo4j-projection")
    ap.add_argument("--fresh", action="store_true", help="start a private server under a temporary home")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the data and a server this script started")
    ap.add_argument("--source-sdist", default=None, metavar="REQ",
                    help="write a real source's graph: a pinned sdist such as django==5.2.19")
    ap.add_argument("--include", action="append", default=None, metavar="GLOB",
                    help="with --source-sdist: the files to read (repeatable; default <name>/**/*.py, docs/**/*.txt)")
    ap.add_argument("--change-file", default=None, metavar="PATH",
                    help="with --source-sdist: the Python file the one-file change edits (default the largest)")
    ap.add_argument("--rebuild-graph", action="store_true", help="with --source-sdist: rebuild the cached graph")
    ap.add_argument("--work", type=Path, default=None,
                    help="with --source-sdist: the cache folder (default bench/out/neo4j-<name>-<version>)")
    ap.add_argument("--compare", type=Path, default=None, metavar="FILE",
                    help="with --source-sdist: another neo4j_store.py, run in alternation with the current one")
    ap.add_argument("--compare-first", action="store_true",
                    help="with --compare: the other store goes first in round 1 (the cold one on a fresh server)")
    ap.add_argument("--server-pid", type=int, default=None,
                    help="the process of a local server given by NEO4J_URI, to report its CPU seconds")
    args = ap.parse_args(argv)
    if args.source_sdist:
        return main_sdist(args)

    server, uri, user, password, started_here, tmp_home, server_start_s = _connect(args)

    server_pid = args.server_pid or (server._pid() if args.fresh or not os.environ.get("NEO4J_URI") else None)
    kwargs = _store_settings(args)
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
        _disconnect(server, started_here, tmp_home, args.keep)

    result = {
        "server": "NEO4J_URI" if os.environ.get("NEO4J_URI") else ("fresh" if args.fresh else "local"),
        "server_start_s": server_start_s if started_here else None,
        "server_jit_flags": jit_flags() if started_here else None,
        "schema_first_s": round(schema_first_s, 3), "schema_again_s": round(schema_again_s, 3),
        "batch_size": store.batch_size, "writers": store.writers, "repeat": args.repeat,
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
