"""Qdrant Edge (qdrant-edge-py, in-process) against qdrant-client's embedded (local) mode.

    .venv/bin/pip install qdrant-edge-py==0.9.0        # bench only; not an mtrag dependency
    .venv/bin/python bench/qdrant_edge_vs_local.py --out bench/out/qdrant_edge.json [--points 20000]

Same process, same seeded data for both engines: N random unit 384-d vectors with payloads like
mtrag's (source_id from 4 values, source_kind, chunk_id, file_path, chunk_type, role, symbol,
content_hash), UUID point ids, cosine, keyword payload indexes on mtrag's KEYWORD_FIELDS.

Per engine: upsert time (batches of 256, then made durable: a WAL checkpoint for local mode as
QdrantStore does, flush() for Edge), reopen-from-disk time, top-20 query p50/p95 plain and
filtered (source_id in 2 of 4), retrieve of 20 ids with vectors (like QdrantStore.vectors_for)
p50, and the top-10 overlap between engines. Edge is measured as written (plain segments: exact
brute force) and again after optimize() (HNSW built for segments above the indexing threshold).

Then the process rules, each tried from a subprocess: can a second process open a folder that
another process holds (Edge, local mode, Edge without WAL)? Does a copy of a held folder open
(the snapshot-copy pattern mtrag's reader uses)? Can two processes share one copy?
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import folder_bytes  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
COLLECTION = "mtrag_code"
# the fields QdrantStore indexes (mtrag_resources/stores/qdrant_store.py KEYWORD_FIELDS)
KEYWORD_FIELDS = ("source_id", "source_kind", "chunk_id", "parent_id", "file_path", "symbol",
                  "repository", "content_hash")
SOURCES = ("src-click", "src-flask", "src-docs-a", "src-docs-b")
FILTER_SOURCES = list(SOURCES[:2])
CHUNK_TYPES = ("function", "class", "module", "method", "section")
ROLES = ("source", "test", "example", "doc")


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def folder_mb(path: Path) -> float:
    """Blocks actually allocated (Edge preallocates sparse 32 MiB mmap/WAL files)."""
    return _folder_bytes(path)[1] / 1e6


def folder_apparent_mb(path: Path) -> float:
    return _folder_bytes(path)[0] / 1e6


def _folder_bytes(path: Path) -> tuple[int, int]:
    return folder_bytes(path)


def make_data(n: int, dim: int, n_queries: int, seed: int):
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(n)]
    payloads = []
    for i in range(n):
        chunk_id = ids[i].replace("-", "")
        payloads.append({
            "source_id": SOURCES[i % len(SOURCES)], "source_kind": "code", "chunk_id": chunk_id,
            "file_path": f"pkg/sub{i % 37}/m{i % 500}.py", "chunk_type": CHUNK_TYPES[i % 5],
            "role": ROLES[(i // 7) % 4], "symbol": f"pkg.m{i % 500}.f{i}",
            "content_hash": f"{i:064x}", "parent_id": None, "repository": "bench",
            "start_line": i % 900, "end_line": i % 900 + 12})
    queries = rng.standard_normal((n_queries, dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    retrieve_sets = [[ids[j] for j in rng.choice(n, size=20, replace=False)]
                     for _ in range(n_queries)]
    return vectors, ids, payloads, queries, retrieve_sets


# ------------------------------------------------------------------------------------------
# engines: the same small interface over both
# ------------------------------------------------------------------------------------------
class LocalEngine:
    """qdrant-client embedded mode, set up the way QdrantStore sets it up."""

    name = "local"

    def __init__(self, path: Path, dim: int, tune_sqlite: bool = True) -> None:
        from qdrant_client import QdrantClient, models
        self.m = models
        self.path, self.dim, self.tune = path, dim, tune_sqlite
        self.client = QdrantClient(path=str(path))

    def _sqlite(self):
        coll = self.client._client.collections.get(COLLECTION)  # same reach-in as QdrantStore
        return getattr(getattr(coll, "storage", None), "storage", None)

    def _tune(self) -> None:
        conn = self._sqlite()
        if self.tune and conn is not None:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")

    def create(self) -> None:
        m = self.m
        self.client.create_collection(
            COLLECTION, vectors_config=m.VectorParams(size=self.dim, distance=m.Distance.COSINE))
        with warnings.catch_warnings():  # "payload indexes have no effect" in local mode
            warnings.simplefilter("ignore")
            for field in KEYWORD_FIELDS:
                self.client.create_payload_index(COLLECTION, field, m.PayloadSchemaType.KEYWORD)
        self._tune()

    def upsert(self, ids, vecs, payloads) -> None:
        m = self.m
        self.client.upsert(COLLECTION, wait=True, points=[
            m.PointStruct(id=i, vector=v.tolist(), payload=p) for i, v, p in zip(ids, vecs, payloads)])

    def durable(self) -> None:
        conn = self._sqlite()
        if self.tune and conn is not None:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self.client.close()

    @classmethod
    def reopen(cls, path: Path, dim: int, tune_sqlite: bool = True) -> "LocalEngine":
        eng = cls(path, dim, tune_sqlite)
        eng._tune()
        return eng

    def count(self) -> int:
        return int(self.client.count(COLLECTION, exact=True).count)

    def _filter(self, sources):
        if not sources:
            return None
        m = self.m
        return m.Filter(must=[m.FieldCondition(key="source_id", match=m.MatchAny(any=list(sources)))])

    def search(self, vec, k: int, sources=None) -> list[tuple[str, float]]:
        res = self.client.query_points(COLLECTION, query=vec.tolist(), limit=k,
                                       query_filter=self._filter(sources),
                                       with_payload=True, with_vectors=False)
        return [(str(p.id), float(p.score)) for p in res.points]

    def retrieve(self, ids) -> dict[str, list[float]]:
        return {str(r.id): r.vector for r in self.client.retrieve(
            COLLECTION, ids, with_payload=False, with_vectors=True)}

    def describe(self) -> dict:
        return {"search": "exact (numpy brute force over all points; payload indexes are "
                          "accepted and ignored; filters are evaluated in Python per point)"}


class EdgeEngine:
    """qdrant-edge-py: one EdgeShard per folder (Edge has no collections)."""

    name = "edge"

    def __init__(self, shard, path: Path, dim: int) -> None:
        import qdrant_edge as q
        self.q, self.shard, self.path, self.dim = q, shard, path, dim

    @classmethod
    def new(cls, path: Path, dim: int) -> "EdgeEngine":
        import qdrant_edge as q
        cfg = q.EdgeConfig(vectors=q.EdgeVectorParams(size=dim, distance=q.Distance.Cosine))
        return cls(q.EdgeShard.create(str(path), cfg), path, dim)

    @classmethod
    def reopen(cls, path: Path, dim: int) -> "EdgeEngine":
        import qdrant_edge as q
        return cls(q.EdgeShard.load(str(path)), path, dim)

    def create(self) -> None:
        q = self.q
        for field in KEYWORD_FIELDS:
            self.shard.update(q.UpdateOperation.create_field_index(field, q.PayloadSchemaType.Keyword))

    def upsert(self, ids, vecs, payloads) -> None:
        q = self.q
        self.shard.update(q.UpdateOperation.upsert_points(
            [q.Point(i, v.tolist(), p) for i, v, p in zip(ids, vecs, payloads)]))

    def durable(self) -> None:
        self.shard.flush()

    def close(self) -> None:
        self.shard.close()

    def count(self) -> int:
        return int(self.shard.count(self.q.CountRequest(exact=True)))

    def _filter(self, sources):
        if not sources:
            return None
        q = self.q
        return q.Filter(must=[q.FieldCondition("source_id", match=q.MatchAny(list(sources)))])

    def search(self, vec, k: int, sources=None, exact: bool = False,
               hnsw_ef: int | None = None) -> list[tuple[str, float]]:
        q = self.q
        params = q.SearchParams(exact=exact, hnsw_ef=hnsw_ef) if (exact or hnsw_ef) else None
        res = self.shard.query(q.QueryRequest(limit=k, query=q.Query.Nearest(vec.tolist()),
                                              filter=self._filter(sources), with_payload=True,
                                              with_vector=False, params=params))
        return [(str(p.id), float(p.score)) for p in res]

    def retrieve(self, ids) -> dict[str, list[float]]:
        return {str(r.id): r.vector for r in self.shard.retrieve(ids, with_payload=False,
                                                                with_vector=True)}

    def info(self) -> dict:
        i = self.shard.info()
        return {"segments": i.segments_count, "points": i.points_count,
                "indexed_vectors": i.indexed_vectors_count,
                "payload_indexes": {k: [str(v.data_type), v.points]
                                    for k, v in sorted(i.payload_schema.items())}}

    def describe(self) -> dict:
        info = self.info()
        how = ("HNSW (indexed_vectors > 0) for indexed segments" if info["indexed_vectors"]
               else "exact brute force: plain segments, no HNSW until optimize()")
        return {"search": how, **info}


# ------------------------------------------------------------------------------------------
# measurements
# ------------------------------------------------------------------------------------------
def time_queries(eng, queries, retrieve_sets, k: int, **kw) -> dict:
    for qv in queries[:5]:  # warm-up, not counted
        eng.search(qv, k, **kw)
        eng.search(qv, k, FILTER_SOURCES, **kw)
    plain_ms, filt_ms, ret_ms, plain_top, filt_top = [], [], [], [], []
    for qv in queries:
        t = time.perf_counter()
        hits = eng.search(qv, k, **kw)
        plain_ms.append((time.perf_counter() - t) * 1000)
        plain_top.append([h[0] for h in hits])
        t = time.perf_counter()
        hits = eng.search(qv, k, FILTER_SOURCES, **kw)
        filt_ms.append((time.perf_counter() - t) * 1000)
        filt_top.append([h[0] for h in hits])
    for ids in retrieve_sets:
        t = time.perf_counter()
        got = eng.retrieve(ids)
        ret_ms.append((time.perf_counter() - t) * 1000)
        assert len(got) == len(ids), (len(got), len(ids))
    return {"plain_ms": {"p50": pct(plain_ms, 50), "p95": pct(plain_ms, 95)},
            "filtered_ms": {"p50": pct(filt_ms, 50), "p95": pct(filt_ms, 95)},
            "retrieve20_ms": {"p50": pct(ret_ms, 50), "p95": pct(ret_ms, 95)},
            "_plain_top": plain_top, "_filt_top": filt_top}


def check_filtered(eng, queries, payload_by_id, k: int) -> bool:
    for qv in queries[:20]:
        for pid, _ in eng.search(qv, k, FILTER_SOURCES):
            if payload_by_id[pid]["source_id"] not in FILTER_SOURCES:
                return False
    return True


def overlap(a: list[list[str]], b: list[list[str]], top: int = 10) -> dict:
    vals = [len(set(x[:top]) & set(y[:top])) / top for x, y in zip(a, b)]
    return {"mean": float(np.mean(vals)), "min": float(np.min(vals)),
            "identical_order": sum(x[:top] == y[:top] for x, y in zip(a, b)) / len(a)}


def bench_engine(kind: str, root: Path, data, args) -> tuple[dict, object]:
    vectors, ids, payloads, queries, retrieve_sets = data
    path = root / kind
    out: dict = {}
    t0 = time.perf_counter()
    eng = EdgeEngine.new(path, args.dim) if kind == "edge" else LocalEngine(path, args.dim, not args.local_default_sqlite)
    eng.create()
    out["create_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in range(0, len(ids), args.batch_size):
        e = s + args.batch_size
        eng.upsert(ids[s:e], vectors[s:e], payloads[s:e])
    t1 = time.perf_counter()
    eng.durable()
    t2 = time.perf_counter()
    out["upsert_s"] = t1 - t0
    out["durable_s"] = t2 - t1
    out["upsert_total_s"] = t2 - t0
    out["upsert_points_per_s"] = len(ids) / (t2 - t0)
    out["count"] = eng.count()
    eng.close()
    out["disk_mb"] = folder_mb(path)
    out["disk_apparent_mb"] = folder_apparent_mb(path)

    t0 = time.perf_counter()
    eng = EdgeEngine.reopen(path, args.dim) if kind == "edge" else LocalEngine.reopen(path, args.dim, not args.local_default_sqlite)
    t1 = time.perf_counter()
    n = eng.count()
    eng.search(queries[0], args.k)
    t2 = time.perf_counter()
    assert n == len(ids), (n, len(ids))
    out["reopen_s"] = t1 - t0
    out["reopen_to_first_query_s"] = t2 - t0
    out.update(time_queries(eng, queries, retrieve_sets, args.k))
    out["filter_respected"] = check_filtered(eng, queries, {i: p for i, p in zip(ids, payloads)}, args.k)
    out["engine"] = eng.describe()
    return out, eng


# ------------------------------------------------------------------------------------------
# process rules: tried from subprocesses
# ------------------------------------------------------------------------------------------
_CHILD = r"""
import sys, json, time
kind, path, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
res = {"kind": kind, "path": path}
t = time.perf_counter()
try:
    if kind == "edge":
        import qdrant_edge as q
        s = q.EdgeShard.load(path)
        res["count"] = s.count(q.CountRequest(exact=True))
    else:
        from qdrant_client import QdrantClient
        c = QdrantClient(path=path)
        res["count"] = sum(c.count(x.name, exact=True).count for x in c.get_collections().collections)
    res["opened"] = True
    res["open_s"] = time.perf_counter() - t
    print("READY " + json.dumps(res), flush=True)
    time.sleep(hold)
    (s.close() if kind == "edge" else c.close())
except Exception as exc:
    res["opened"] = False
    res["error"] = f"{type(exc).__name__}: {exc}"[:400]
    print("READY " + json.dumps(res), flush=True)
"""


def child_open(kind: str, path: Path, hold: float = 0.0, wait: bool = True):
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, kind, str(path), str(hold)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(path.parent))
    line = ""
    while True:  # the first READY line
        line = proc.stdout.readline()
        if not line or line.startswith("READY "):
            break
    res = json.loads(line[6:]) if line.startswith("READY ") else {"opened": False, "error": proc.stderr.read()[-400:]}
    if wait:
        proc.wait(timeout=120)
        return res
    return res, proc


def concurrency_tests(root: Path, edge: EdgeEngine, local: LocalEngine, data, args) -> dict:
    import qdrant_edge as q
    vectors, ids, payloads, *_ = data
    out: dict = {}
    # 1. the writer (this process) holds each folder open: a second process tries to open it
    out["edge_second_process_while_held"] = child_open("edge", edge.path)
    out["local_second_process_while_held"] = child_open("local", local.path)

    # 2. snapshot-copy pattern: flushed writer, copy the folder, a reader process opens the copy
    edge.shard.flush()
    copy = root / "edge-copy"
    t0 = time.perf_counter()
    shutil.copytree(edge.path, copy)
    out["edge_copy_s"] = time.perf_counter() - t0
    out["edge_copy_mb"] = {"source_allocated": folder_mb(edge.path),
                           "copy_allocated": folder_mb(copy), "apparent": folder_apparent_mb(copy),
                           "how": "shutil.copytree (as mtrag's publish and reader copied before hard links)"}
    out["edge_copy_open_while_writer_holds_source"] = child_open("edge", copy)
    # 2b. two reader processes on the one copy
    first, proc = child_open("edge", copy, hold=4.0, wait=False)
    second = child_open("edge", copy)
    proc.wait(timeout=120)
    out["edge_two_readers_one_copy"] = {"first": first, "second": second}

    # 3. unflushed writes: does a copy taken before flush() see them (WAL replay on load)?
    extra = 100
    rng = np.random.default_rng(1)
    new_ids = [str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(extra)]
    edge.upsert(new_ids, vectors[:extra], payloads[:extra])
    copy2 = root / "edge-copy-unflushed"
    shutil.copytree(edge.path, copy2)
    res = child_open("edge", copy2)
    res["expected_count"] = len(ids) + extra
    out["edge_copy_before_flush"] = res
    edge.shard.update(q.UpdateOperation.delete_points(new_ids))
    edge.shard.flush()

    # 4. a reader process that holds the live folder blocks the writer (this process)
    edge.close()
    first, proc = child_open("edge", edge.path, hold=4.0, wait=False)
    try:
        q.EdgeShard.load(str(edge.path)).close()
        writer = {"opened": True}
    except Exception as exc:  # noqa: BLE001
        writer = {"opened": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
    proc.wait(timeout=120)
    out["edge_writer_while_reader_process_holds"] = {"reader": first, "writer": writer}

    # 5. the same with WAL disabled: is there still a lock?
    nowal = root / "edge-nowal"
    s = q.EdgeShard.create(str(nowal), q.EdgeConfig(
        vectors=q.EdgeVectorParams(size=args.dim, distance=q.Distance.Cosine), wal_enabled=False))
    s.update(q.UpdateOperation.upsert_points([q.Point(ids[0], vectors[0].tolist(), payloads[0])]))
    s.flush()
    out["edge_nowal_second_process_while_held"] = child_open("edge", nowal)
    s.close()
    return out


# ------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--points", type=int, default=20_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--local-default-sqlite", action="store_true",
                    help="leave qdrant-client's SQLite at its defaults (rollback journal, an fsync "
                         "per point) instead of QdrantStore's WAL + synchronous=NORMAL")
    ap.add_argument("--hnsw-ef", type=int, default=256,
                    help="beam for the second HNSW pass after optimize() (default 256)")
    ap.add_argument("--no-optimize", action="store_true", help="skip the Edge optimize()/HNSW pass")
    ap.add_argument("--no-concurrency", action="store_true")
    ap.add_argument("--path", type=Path, default=None, help="work folder (default: a temp dir)")
    args = ap.parse_args()

    import qdrant_client
    from importlib.metadata import version
    try:
        import qdrant_edge  # noqa: F401
    except ImportError:
        print("qdrant-edge-py is not installed: .venv/bin/pip install qdrant-edge-py", file=sys.stderr)
        return 2

    data = make_data(args.points, args.dim, args.queries, args.seed)
    result: dict = {
        "bench": "qdrant_edge", "points": args.points, "dim": args.dim, "queries": args.queries,
        "k": args.k, "batch_size": args.batch_size, "filter": f"source_id in {FILTER_SOURCES} (2 of 4)",
        "versions": {"qdrant-edge-py": version("qdrant-edge-py"),
                     "qdrant-client": version("qdrant-client"), "numpy": np.__version__},
        "local_sqlite": "default" if args.local_default_sqlite else "WAL + synchronous=NORMAL (as QdrantStore)",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform()},
    }
    tmp = tempfile.mkdtemp(prefix="mtrag-bench-edge-", dir=args.path)
    root = Path(tmp)
    try:
        local, local_eng = bench_engine("local", root, data, args)
        print(f"local done: upsert {local['upsert_total_s']:.1f} s", flush=True)
        edge, edge_eng = bench_engine("edge", root, data, args)
        print(f"edge done: upsert {edge['upsert_total_s']:.1f} s", flush=True)
        agree = {"plain_top10": overlap(local.pop("_plain_top"), edge["_plain_top"]),
                 "filtered_top10": overlap(local.pop("_filt_top"), edge["_filt_top"])}
        result["local"], result["edge"] = local, edge
        result["agreement_local_vs_edge"] = agree

        if not args.no_optimize:
            opt: dict = {}
            t0 = time.perf_counter()
            opt["optimized"] = bool(edge_eng.shard.optimize())
            opt["optimize_s"] = time.perf_counter() - t0
            edge_eng.shard.flush()
            opt["disk_mb"] = folder_mb(edge_eng.path)
            opt["disk_apparent_mb"] = folder_apparent_mb(edge_eng.path)
            q = time_queries(edge_eng, data[3], data[4], args.k)
            opt.update({k: v for k, v in q.items() if not k.startswith("_")})
            opt["engine"] = edge_eng.describe()
            opt["agreement_vs_exact"] = {
                "plain_top10": overlap(edge["_plain_top"], q["_plain_top"]),
                "filtered_top10": overlap(edge["_filt_top"], q["_filt_top"])}
            # the same shard with a wider HNSW beam, and with SearchParams(exact=True)
            for label, kw in ((f"hnsw_ef_{args.hnsw_ef}", {"hnsw_ef": args.hnsw_ef}),
                              ("exact_param", {"exact": True})):
                v = time_queries(edge_eng, data[3], data[4], args.k, **kw)
                opt[label] = {k: v[k] for k in ("plain_ms", "filtered_ms")}
                opt[label]["agreement_vs_exact"] = {
                    "plain_top10": overlap(edge["_plain_top"], v["_plain_top"]),
                    "filtered_top10": overlap(edge["_filt_top"], v["_filt_top"])}
            result["edge_optimized"] = opt
            print(f"edge optimize: {opt['optimize_s']:.1f} s", flush=True)
        edge.pop("_plain_top"), edge.pop("_filt_top")

        if not args.no_concurrency:
            result["process_rules"] = concurrency_tests(root, edge_eng, local_eng, data, args)
        else:
            edge_eng.close()
        local_eng.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print_table(result)
    print(f"wrote {args.out}")
    return 0


def print_table(r: dict) -> None:
    cols = [("local", r["local"]), ("edge (plain)", r["edge"])]
    if "edge_optimized" in r:
        cols.append(("edge (optimized)", r["edge_optimized"]))
    rows = [
        ("upsert N, batches (s)", lambda d: d.get("upsert_s")),
        ("make durable (s)", lambda d: d.get("durable_s")),
        ("upsert total (s)", lambda d: d.get("upsert_total_s")),
        ("points/s", lambda d: d.get("upsert_points_per_s")),
        ("optimize() (s)", lambda d: d.get("optimize_s")),
        ("disk allocated (MB)", lambda d: d.get("disk_mb")),
        ("disk apparent (MB)", lambda d: d.get("disk_apparent_mb")),
        ("reopen (s)", lambda d: d.get("reopen_s")),
        ("reopen->1st query (s)", lambda d: d.get("reopen_to_first_query_s")),
        ("plain top-20 p50 (ms)", lambda d: d["plain_ms"]["p50"]),
        ("plain top-20 p95 (ms)", lambda d: d["plain_ms"]["p95"]),
        ("filtered p50 (ms)", lambda d: d["filtered_ms"]["p50"]),
        ("filtered p95 (ms)", lambda d: d["filtered_ms"]["p95"]),
        ("retrieve 20 p50 (ms)", lambda d: d["retrieve20_ms"]["p50"]),
    ]
    print(f"\n{r['points']} points x {r['dim']} d, {r['queries']} queries, k={r['k']}; "
          f"qdrant-edge-py {r['versions']['qdrant-edge-py']}, qdrant-client {r['versions']['qdrant-client']}")
    print(f"{'':26}" + "".join(f"{name:>18}" for name, _ in cols))
    for label, get in rows:
        cells = []
        for _, d in cols:
            try:
                v = get(d)
            except KeyError:
                v = None
            cells.append(f"{v:>18.2f}" if isinstance(v, (int, float)) else f"{'-':>18}")
        print(f"{label:26}" + "".join(cells))
    a = r["agreement_local_vs_edge"]
    print(f"top-10 overlap local vs edge: plain {a['plain_top10']['mean']:.3f} "
          f"(min {a['plain_top10']['min']:.2f}), filtered {a['filtered_top10']['mean']:.3f} "
          f"(min {a['filtered_top10']['min']:.2f})")
    if "edge_optimized" in r:
        o = r["edge_optimized"]["agreement_vs_exact"]
        print(f"top-10 overlap edge HNSW vs exact: plain {o['plain_top10']['mean']:.3f} "
              f"(min {o['plain_top10']['min']:.2f}), filtered {o['filtered_top10']['mean']:.3f} "
              f"(min {o['filtered_top10']['min']:.2f})")
        for key, sub in r["edge_optimized"].items():
            if isinstance(sub, dict) and "agreement_vs_exact" in sub:
                a2 = sub["agreement_vs_exact"]
                print(f"  edge optimized, {key}: plain p50 {sub['plain_ms']['p50']:.2f} ms p95 "
                      f"{sub['plain_ms']['p95']:.2f}, filtered p50 {sub['filtered_ms']['p50']:.2f} ms "
                      f"p95 {sub['filtered_ms']['p95']:.2f}; top-10 overlap vs exact plain "
                      f"{a2['plain_top10']['mean']:.3f}, filtered {a2['filtered_top10']['mean']:.3f}")
    for label, key in (("local", "local"), ("edge", "edge"), ("edge optimized", "edge_optimized")):
        if key in r:
            print(f"search mode {label}: {r[key]['engine']['search']}")
    for name, res in (r.get("process_rules") or {}).items():
        print(f"{name}: {json.dumps(res, default=str)[:300]}")


if __name__ == "__main__":
    raise SystemExit(main())
