"""The embedded vector engine alone (Qdrant Edge through QdrantStore) at growing sizes.

    nice -n 10 .venv/bin/python bench/vector_curve.py [--sizes 10000,100000,1000000]
        [--out bench/out/vector_curve.json] [--merge] [--label L --override KEY=VALUE ...]
    .venv/bin/python bench/vector_curve.py --table        # the table of an earlier --out

Per size N, on a fresh `QdrantStore(path=..., engine="edge")` (the shard config is mtrag's own,
qdrant_edge_client.edge_config(): on-disk vectors and payload, HNSW m=16 ef_construct=100, and
QdrantStore's keyword payload indexes):

- data: N random unit 384-d vectors from a fixed seed, generated in seeded blocks so no process
  holds them all. `--data spectrum` (default) gives them the second-order shape of mtrag's own
  MiniLM vectors (see SPECTRUM_* below); `--data uniform` is independent uniform directions, the
  hardest case for HNSW (no structure: neighbours are near-ties, and the build costs most).
  Payloads are mtrag-shaped (source_id from --sources values, source_kind, chunk_id of 32 hex,
  parent_id, file_path, symbol, start/end line, title, ~800 chars of text, content_hash,
  repository: ~1.2 KB of JSON; mtrag's real code payloads are ~0.9 KB).
- upsert: written source by source in batches of --batch-size, each source bracketed by its
  marker and flushed before its commit as write_source does. `--writer client` (default) goes
  through the adapter's client, building each batch's payloads only when it is written; `--writer
  write_source` calls QdrantStore.write_source once per source (N/sources payload dicts at once).
  The bench's own data generation is timed apart (`points_per_s_without_generation`).
- optimize: `store.client.optimize("mtrag_code")` (what publish_snapshot runs): segments merged
  and HNSW built; wall and process CPU seconds, and from a sampler process (optimize() holds the
  GIL) the CPU per thread name (hnsw-build-*), busy threads per 0.25 s and peak RSS / RssAnon.
- query p50/p95, k=10, --queries queries, plain and filtered to one source
  (`search(..., source_ids=[one])`), each query a stored vector plus noise; chunk ids only, as
  mtrag's dense channel asks (payload_fields=[]); the plain query with the full payload too.
- recall@10 of those results against exact numpy brute force (plain and filtered) on
  --recall-queries of the queries, and how often the stored vector a query came from ranks 1;
  the same queries again on the shard with hnsw_ef 64/128/256, exact=True (which must give 1.0:
  the check of the brute force), ACORN, and with --override int8=1 a rescored x2 oversampling.
- reopen: close, then in a fresh subprocess `QdrantStore(path=...)` until the first query is
  answered (imports timed apart); the same queries again there; its VmRSS / VmHWM.
- RSS of the writing process per phase (a subprocess of its own), and the folder's disk use
  (allocated blocks, as du; apparent size beside it: Edge preallocates sparse files).

`--override` changes the shard config for an experiment (not mtrag's config; name the run with
--label): m, ef_construct, payload_m, full_scan_threshold, max_indexing_threads,
default_segment_number, max_segment_size, indexing_threshold, vectors_in_ram=1, int8=1 (scalar
int8 quantization kept in RAM), no_index=FIELD+FIELD (keyword indexes left out). Before each size
the optimize CPU of the previous ones is extrapolated and printed. The machine is shared: run it
with `nice -n 10`; `--merge` keeps the entries of an earlier --out that this run does not measure.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import folder_bytes, percentile  # noqa: E402

KIND = "code"
COLLECTION = "mtrag_code"
DIM = 384
BLOCK = 8192  # vectors are generated in seeded blocks, so any range can be regenerated
_WORDS = ("def", "return", "self", "value", "config", "request", "response", "handler", "parse",
          "token", "context", "option", "command", "group", "param", "default", "callback",
          "string", "stream", "format", "error", "raise", "import", "module", "class", "method",
          "template", "render", "session", "cookie", "header", "route", "blueprint", "app",
          "test", "client", "json", "encode", "decode", "path", "file", "open", "close", "read",
          "write", "line", "column", "index", "cache", "lookup", "resolve", "name", "type")


# ------------------------------------------------------------------------------------------
# the data: a pure function of (seed, index), so no process holds all of it
# ------------------------------------------------------------------------------------------
GROUP = 16  # consecutive points in runs (the chunks of one file) around a shared centre
# --data spectrum: the second-order shape of mtrag's own vectors. Fitted to the 1,022 click +
# flask code chunks of a bench/build.py home (all-MiniLM-L6-v2 through mtrag's embedder): 50 /
# 80 / 90% of the variance in 21 / 69 / 113 principal components (eigenvalues ~ k^-0.9 over the
# first 100), a common mean direction (norm of the mean vector 0.52, so a random pair has cosine
# ~0.27) and a nearest neighbour at cosine ~0.78.
SPECTRUM_ALPHA, SPECTRUM_MEAN, SPECTRUM_SPREAD = 0.9, 0.75, 0.8
DATA = {"kind": "spectrum"}  # set from the command line
_BASIS: dict = {}


def _basis(seed: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sqrt eigenvalues, random orthonormal basis, mean direction) of the `spectrum` data."""
    key = (seed, dim)
    if key not in _BASIS:
        rng = np.random.default_rng([seed, 4242])
        lam = np.arange(1, dim + 1, dtype=np.float64) ** -SPECTRUM_ALPHA
        lam /= lam.sum()
        basis = np.linalg.qr(rng.standard_normal((dim, dim)))[0]
        mean = rng.standard_normal(dim)
        _BASIS[key] = (np.sqrt(lam).astype(np.float32), basis.T.astype(np.float32),
                       (SPECTRUM_MEAN * mean / np.linalg.norm(mean)).astype(np.float32))
    return _BASIS[key]


def block_vectors(seed: int, b: int, dim: int = DIM) -> np.ndarray:
    """BLOCK unit vectors, a pure function of (seed, block). `uniform`: independent random unit
    vectors, no structure at all (the hardest case for HNSW: in 384 dimensions every point's
    neighbours are near-ties, and its build cost grows fastest). `spectrum` (default): runs of
    GROUP points around a centre, centres and offsets Gaussian with mtrag's spectrum (above)."""
    rng = np.random.default_rng([seed, b])
    if DATA["kind"] == "uniform":
        v = rng.standard_normal((BLOCK, dim)).astype(np.float32)
    else:
        sd, basis, mean = _basis(seed, dim)
        centres = mean + (rng.standard_normal((BLOCK // GROUP, dim)).astype(np.float32) * sd) @ basis
        offsets = (rng.standard_normal((BLOCK, dim)).astype(np.float32) * sd) @ basis
        v = np.repeat(centres, GROUP, axis=0) + SPECTRUM_SPREAD * offsets
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def vectors_range(seed: int, lo: int, hi: int, dim: int = DIM) -> np.ndarray:
    out = np.empty((hi - lo, dim), dtype=np.float32)
    i = lo
    while i < hi:
        b = i // BLOCK
        blk = block_vectors(seed, b, dim)
        end = min(hi, (b + 1) * BLOCK)
        out[i - lo:end - lo] = blk[i - b * BLOCK:end - b * BLOCK]
        i = end
    return out


def source_of(i: int, n: int, n_sources: int) -> int:
    """Sources are contiguous ranges of the index, as write_source writes them."""
    return i * n_sources // n


def source_range(s: int, n: int, n_sources: int) -> tuple[int, int]:
    return -(-s * n // n_sources), -(-(s + 1) * n // n_sources)


def source_id(s: int) -> str:
    return f"src-{s:02d}"


def chunk_id(seed: int, i: int) -> str:
    """32 hex like mtrag's chunk ids: 24 pseudo-random hex, then the index (for the recall check)."""
    return hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=12).hexdigest() + f"{i:08x}"


def index_of(cid: str) -> int:
    return int(cid[-8:], 16)


_TEXT_POOL: list[str] = []


def _text(seed: int, i: int) -> str:
    if not _TEXT_POOL:
        rng = np.random.default_rng([seed, 7])
        for _ in range(512):
            words = rng.choice(len(_WORDS), size=400)
            _TEXT_POOL.append(" ".join(_WORDS[w] for w in words))
    base = _TEXT_POOL[i % len(_TEXT_POOL)]
    off = (i * 31) % 1200
    return f"func_{i}: " + base[off:off + 790]


def payload(seed: int, i: int, n: int, n_sources: int, with_ids: bool = True) -> dict:
    """mtrag's payload shape (qdrant_collection.payload_for + write_source's fields)."""
    s = source_of(i, n, n_sources)
    sid = source_id(s)
    mod, sub = (i // 20) % 1000, (i // 400) % 50
    start = (i % 20) * 40 + 1
    p = {"parent_id": chunk_id(seed, i - i % 4) if i % 4 else None,
         "file_path": f"pkg{s}/sub{sub}/mod{mod}.py",
         "symbol": f"pkg{s}.sub{sub}.mod{mod}.func_{i}",
         "start_line": start, "end_line": start + 12 + i % 25, "title": f"func_{i}",
         "text": _text(seed, i),
         "content_hash": hashlib.blake2b(f"c{seed}:{i}".encode(), digest_size=32).hexdigest(),
         "repository": f"github.com/bench/{sid}"}
    if with_ids:  # write_source adds these itself
        p.update(source_id=sid, source_kind=KIND, chunk_id=chunk_id(seed, i))
    return p


def make_queries(seed: int, n: int, count: int, noise: float, dim: int = DIM):
    """Stored vectors plus noise (|noise| ~ `noise`, so cos(query, origin) ~ 1/sqrt(1+noise^2))."""
    rng = np.random.default_rng([seed, 99])
    origin = rng.choice(n, size=count, replace=count > n)
    q = np.stack([vectors_range(seed, int(j), int(j) + 1, dim)[0] for j in origin])
    q += noise * rng.standard_normal(q.shape).astype(np.float32) / math.sqrt(dim)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q.astype(np.float32), origin


def brute_force(seed: int, n: int, queries: np.ndarray, k: int, n_sources: int,
                sources: list[int] | None) -> list[list[int]]:
    """Exact top-k indices by cosine (dot of unit vectors), per query; `sources[j]` restricts
    query j to one source (whose points are a contiguous range)."""
    nq = len(queries)
    best_s = np.full((nq, k), -np.inf, dtype=np.float32)
    best_i = np.full((nq, k), -1, dtype=np.int64)
    if sources is None:
        ranges = [(0, n, list(range(nq)))]
    else:
        ranges = []
        for s in sorted(set(sources)):
            lo, hi = source_range(s, n, n_sources)
            ranges.append((lo, hi, [j for j in range(nq) if sources[j] == s]))
    for lo, hi, qs in ranges:
        qm = queries[qs]
        for start in range(lo, hi, BLOCK * 4):
            end = min(hi, start + BLOCK * 4)
            scores = vectors_range(seed, start, end) @ qm.T  # (rows, len(qs))
            for col, j in enumerate(qs):
                cand_s = np.concatenate([best_s[j], scores[:, col]])
                cand_i = np.concatenate([best_i[j], np.arange(start, end)])
                top = np.argpartition(-cand_s, k - 1)[:k]
                best_s[j], best_i[j] = cand_s[top], cand_i[top]
    out = []
    for j in range(nq):
        order = np.argsort(-best_s[j])
        out.append([int(x) for x in best_i[j][order]])
    return out


# ------------------------------------------------------------------------------------------
# process figures
# ------------------------------------------------------------------------------------------
def proc_status() -> dict:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                key, val = line.split(":", 1)
                out[key + "_mb"] = round(int(val.split()[0]) / 1024, 1)
    return out


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def disk(path: Path) -> dict:
    apparent, allocated = folder_bytes(path)
    return {"allocated_mb": round(allocated / 1e6, 1), "apparent_mb": round(apparent / 1e6, 1)}


def shard_info(store) -> dict:
    shard = store.client._shard(COLLECTION)
    i = shard.info()
    return {"segments": i.segments_count, "points": i.points_count,
            "indexed_vectors": i.indexed_vectors_count}


def segment_sizes(path: Path) -> list[dict]:
    """Per segment folder: points' vector bytes on disk and whether it has an HNSW graph."""
    segs = []
    root = path / COLLECTION / "segments"
    if not root.is_dir():
        return segs
    for seg in sorted(root.iterdir()):
        if not seg.is_dir():
            continue
        hnsw = any(p.name.startswith("graph") or "hnsw" in p.name for p in seg.rglob("*"))
        segs.append({"name": seg.name[:8], "allocated_mb": disk(seg)["allocated_mb"], "hnsw": hnsw})
    return segs


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# queries
# ------------------------------------------------------------------------------------------
def run_queries(store, queries: np.ndarray, q_sources: list[int], k: int,
                full_payload: bool = True) -> dict:
    """Latencies (ms) and the returned indices of plain and one-source-filtered searches."""
    for qv in queries[:5]:  # warm-up
        store.search(KIND, qv, k=k, payload_fields=[])
        store.search(KIND, qv, k=k, source_ids=[source_id(q_sources[0])], payload_fields=[])
    plain, filt, full, plain_top, filt_top = [], [], [], [], []
    for qv, s in zip(queries, q_sources):
        t = time.perf_counter()
        hits = store.search(KIND, qv, k=k, payload_fields=[])
        plain.append((time.perf_counter() - t) * 1000)
        plain_top.append([index_of(h["chunk_id"]) for h in hits])
        t = time.perf_counter()
        hits = store.search(KIND, qv, k=k, source_ids=[source_id(s)], payload_fields=[])
        filt.append((time.perf_counter() - t) * 1000)
        filt_top.append([index_of(h["chunk_id"]) for h in hits])
        if full_payload:
            t = time.perf_counter()
            store.search(KIND, qv, k=k)
            full.append((time.perf_counter() - t) * 1000)
    out = {"plain_ms": {"p50": percentile(plain, 50), "p95": percentile(plain, 95),
                        "max": max(plain)},
           "filtered_ms": {"p50": percentile(filt, 50), "p95": percentile(filt, 95),
                           "max": max(filt)},
           "_plain_top": plain_top, "_filt_top": filt_top}
    if full:
        out["plain_full_payload_ms"] = {"p50": percentile(full, 50), "p95": percentile(full, 95)}
    return out


def recall(got: list[list[int]], truth: list[list[int]], k: int) -> dict:
    vals = [len(set(g[:k]) & set(t[:k])) / k for g, t in zip(got, truth)]
    return {"mean": round(float(np.mean(vals)), 4), "min": round(float(np.min(vals)), 2)}


# ------------------------------------------------------------------------------------------
# children
# ------------------------------------------------------------------------------------------
QUANTIZED = {"on": False}


def apply_overrides(overrides: dict) -> None:
    """Bench experiments only: replace qdrant_edge_client.edge_config (which EdgeClient's
    create_collection calls) by one with some HNSW / optimizer / storage settings changed.
    mtrag's own config is what runs without --override."""
    if not overrides:
        return
    import qdrant_edge as qe
    from mtrag_resources.stores import qdrant_edge_client as ec
    from mtrag_resources.stores import qdrant_store as qs
    QUANTIZED["on"] = bool(overrides.get("int8"))
    if overrides.get("no_index"):  # keyword payload indexes left out (QdrantStore.KEYWORD_FIELDS)
        drop = set(str(overrides["no_index"]).split("+"))
        qs.KEYWORD_FIELDS = tuple(f for f in qs.KEYWORD_FIELDS if f not in drop)
    base = ec.edge_config

    def patched(size: int, distance: str = "Cosine"):
        c = base(size, distance)
        h = c.hnsw_config
        hnsw = {"m": h.m, "ef_construct": h.ef_construct, "full_scan_threshold": h.full_scan_threshold,
                "max_indexing_threads": h.max_indexing_threads}
        if h.payload_m is not None:
            hnsw["payload_m"] = h.payload_m
        for key in ("m", "ef_construct", "full_scan_threshold", "max_indexing_threads", "payload_m"):
            if key in overrides:
                hnsw[key] = int(overrides[key])
        opt = {k: int(overrides[k]) for k in ("default_segment_number", "max_segment_size",
                                               "indexing_threshold") if k in overrides}
        vec = qe.EdgeVectorParams(size=int(size), distance=getattr(qe.Distance, distance),
                                  on_disk=not overrides.get("vectors_in_ram", False))
        quant = (qe.ScalarQuantizationConfig(qe.ScalarType.Int8, always_ram=True)
                 if overrides.get("int8") else c.quantization_config)
        return qe.EdgeConfig(vectors=vec, on_disk_payload=c.on_disk_payload,
                             hnsw_config=qe.HnswIndexConfig(**hnsw), quantization_config=quant,
                             optimizers=qe.EdgeOptimizersConfig(**opt) if opt else c.optimizers,
                             max_search_threads=c.max_search_threads)

    ec.edge_config = patched


def sample_threads(pid: int, stop: Path, out: Path, dt: float = 0.25) -> None:
    """A separate process (Edge's optimize() holds the GIL, so no thread of the bench's own would
    run): per thread name, the CPU seconds it used, and how many threads were busy (>= half a
    core) per `dt` interval, until `stop` exists."""
    tick = os.sysconf("SC_CLK_TCK")

    def read() -> dict[str, tuple[str, float]]:
        now = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                    st = fh.read()
            except OSError:
                continue
            fields = st[st.rindex(")") + 2:].split()
            now[tid] = (st[st.index("(") + 1:st.rindex(")")], (int(fields[11]) + int(fields[12])) / tick)
        return now

    def mem() -> dict[str, float]:
        out = {}
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "RssAnon:", "RssFile:")):
                    key, val = line.split(":", 1)
                    out[key + "_mb"] = int(val.split()[0]) / 1024
        return out

    last, total, hist, peak = read(), {}, {}, {}
    while not stop.exists():
        time.sleep(dt)
        for key, val in mem().items():
            peak[key] = max(peak.get(key, 0.0), val)
        now, busy = read(), 0
        for tid, (name, c) in now.items():
            d = c - last[tid][1] if tid in last else c
            busy += d >= 0.5 * dt
            total[name] = total.get(name, 0.0) + d
        hist[str(busy)] = hist.get(str(busy), 0) + 1
        last = now
    out.write_text(json.dumps({
        "busy_threads_per_interval": dict(sorted(hist.items())), "interval_s": dt,
        "peak_mb": {k: round(v, 1) for k, v in peak.items()},
        "cpu_s_by_thread_name": {k: round(v, 1) for k, v in sorted(total.items(), key=lambda kv: -kv[1])
                                 if v >= 0.2}}))


class ThreadSampler:
    def __init__(self, folder: Path) -> None:
        self.stop, self.out = folder / "sampler.stop", folder / "sampler.json"
        for f in (self.stop, self.out):
            f.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, __file__, "--_child=sample",
                                      json.dumps([os.getpid(), str(self.stop), str(self.out)])])
        time.sleep(0.5)  # its first reading

    def result(self) -> dict:
        self.stop.touch()
        self.proc.wait(timeout=60)
        try:
            return json.loads(self.out.read_text())
        finally:
            for f in (self.stop, self.out):
                f.unlink(missing_ok=True)


def child_build(cfg: dict) -> dict:
    DATA.update(cfg["data"])
    apply_overrides(cfg["overrides"])
    from mtrag_resources.stores.qdrant_store import QdrantStore, point_id
    from mtrag_resources.stores import qdrant_edge_client as ec
    edge_config = ec.edge_config

    n, seed, bs, ns = cfg["n"], cfg["seed"], cfg["batch_size"], cfg["sources"]
    path = Path(cfg["path"])
    out: dict = {"rss_start": proc_status()}
    c = edge_config(DIM)
    h = c.hnsw_config
    o = c.optimizers
    from mtrag_resources.stores import qdrant_store as qs
    out["keyword_indexes"] = list(qs.KEYWORD_FIELDS)
    out["edge_config"] = {
        "vectors_on_disk": c.vectors[""].on_disk, "on_disk_payload": c.on_disk_payload,
        "hnsw": {"m": h.m, "ef_construct": h.ef_construct, "payload_m": h.payload_m,
                 "full_scan_threshold_kb": h.full_scan_threshold,
                 "max_indexing_threads": h.max_indexing_threads},
        "optimizers": None if o is None else {
            "default_segment_number": o.default_segment_number,
            "max_segment_size_kb": o.max_segment_size, "indexing_threshold_kb": o.indexing_threshold},
        "max_search_threads": c.max_search_threads,
        "quantization": None if c.quantization_config is None else repr(c.quantization_config)}

    store = QdrantStore(path=path, engine="edge")
    store.ensure_collection(KIND, DIM)
    m = store._models
    split = {"generate_s": 0.0, "point_structs_s": 0.0, "engine_upsert_s": 0.0, "flush_s": 0.0}
    t0 = time.perf_counter()
    c0 = cpu_s()
    for s in range(ns):
        lo, hi = source_range(s, n, ns)
        sid = source_id(s)
        if cfg["writer"] == "write_source":
            pts = []
            for start in range(lo, hi, BLOCK):
                end = min(hi, start + BLOCK)
                vecs = vectors_range(seed, start, end)
                pts.extend({"chunk_id": chunk_id(seed, i), "vector": vecs[i - start],
                            "payload": payload(seed, i, n, ns, with_ids=False)}
                           for i in range(start, end))
            store.write_source(sid, KIND, "g1", pts, batch_size=bs, skip_unchanged=False)
            del pts
        else:
            # write_source's own steps for a new source (begin, batches of PointStruct, flush,
            # commit), with the bench's data generation and the adapter's work timed apart
            store.begin(sid, "g1")
            for start in range(lo, hi, BLOCK):
                end = min(hi, start + BLOCK)
                tg = time.perf_counter()
                vecs = vectors_range(seed, start, end)
                split["generate_s"] += time.perf_counter() - tg
                for b in range(start, end, bs):
                    e = min(end, b + bs)
                    tg = time.perf_counter()
                    rows = [(point_id(chunk_id(seed, i)), vecs[i - start], payload(seed, i, n, ns))
                            for i in range(b, e)]
                    tw = time.perf_counter()
                    pts = [m.PointStruct(id=pid, vector=vec.tolist(), payload=pl) for pid, vec, pl in rows]
                    tu = time.perf_counter()
                    store.client.upsert(COLLECTION, wait=True, points=pts)
                    te = time.perf_counter()
                    split["generate_s"] += tw - tg
                    split["point_structs_s"] += tu - tw
                    split["engine_upsert_s"] += te - tu
            tf = time.perf_counter()
            store.client.flush(COLLECTION)  # write_source's _sync_local before the marker commits
            split["flush_s"] += time.perf_counter() - tf
            store.commit(sid, "g1")
        if n >= 100_000:
            el = time.perf_counter() - t0
            log(f"  [{n}] upserted {hi} points, {el:.0f} s, {hi / el:.0f} points/s")
    store.checkpoint()
    up_s = time.perf_counter() - t0
    out["upsert"] = {"seconds": up_s, "points_per_s": n / up_s, "cpu_s": cpu_s() - c0,
                     "writer": cfg["writer"], "batch_size": bs}
    if cfg["writer"] == "client":
        out["upsert"]["split_s"] = split
        out["upsert"]["points_per_s_without_generation"] = n / (up_s - split["generate_s"])
    out["rss_after_upsert"] = proc_status()
    out["disk_after_upsert"] = disk(path)
    out["shard_before_optimize"] = shard_info(store)
    log(f"  [{n}] upsert {up_s:.1f} s ({n / up_s:.0f} points/s); {out['shard_before_optimize']}")

    queries, origin = make_queries(seed, n, cfg["queries"], cfg["noise"])
    q_sources = [source_of(int(j), n, ns) for j in origin]
    nr = cfg["recall_queries"]
    if cfg["exact_before"]:  # the same queries on the unindexed segments (exact scan), a few
        few = min(20, len(queries))
        pre = run_queries(store, queries[:few], q_sources[:few], cfg["k"], full_payload=False)
        out["before_optimize"] = {k: v for k, v in pre.items() if not k.startswith("_")}
        out["before_optimize"]["queries"] = few

    sampler = ThreadSampler(path.parent)
    t0 = time.perf_counter()
    c0 = cpu_s()
    store.client.optimize(COLLECTION)
    opt_wall = time.perf_counter() - t0
    opt_cpu = cpu_s() - c0
    out["optimize_threads"] = sampler.result()
    t1 = time.perf_counter()
    store.checkpoint()
    flush_s = time.perf_counter() - t1
    out["optimize"] = {"seconds": opt_wall, "cpu_s": opt_cpu,
                       "cpu_per_wall": opt_cpu / opt_wall if opt_wall > 0 else None,
                       "flush_after_s": flush_s}
    out["shard_after_optimize"] = shard_info(store)
    out["segments"] = segment_sizes(path)
    out["rss_after_optimize"] = proc_status()
    out["disk"] = disk(path)
    log(f"  [{n}] optimize {opt_wall:.1f} s (cpu {opt_cpu:.1f} s, x{opt_cpu / max(opt_wall, 1e-9):.2f}); "
        f"{out['shard_after_optimize']}")

    q = run_queries(store, queries, q_sources, cfg["k"])
    out["query"] = {k: v for k, v in q.items() if not k.startswith("_")}
    out["rss_after_queries"] = proc_status()
    t0 = time.perf_counter()
    truth_plain = brute_force(seed, n, queries[:nr], cfg["k"], ns, None)
    truth_filt = brute_force(seed, n, queries[:nr], cfg["k"], ns, q_sources[:nr])
    out["brute_force_s"] = time.perf_counter() - t0
    out["recall_at_10"] = {"plain": recall(q["_plain_top"][:nr], truth_plain, cfg["k"]),
                           "filtered": recall(q["_filt_top"][:nr], truth_filt, cfg["k"]),
                           "queries": nr}
    out["origin_at_rank1"] = {
        "plain": sum(t[:1] == [int(j)] for t, j in zip(q["_plain_top"], origin)) / len(origin),
        "filtered": sum(t[:1] == [int(j)] for t, j in zip(q["_filt_top"], origin)) / len(origin)}
    out["filtered_hits_in_source"] = all(
        source_of(i, n, ns) == s for top, s in zip(q["_filt_top"], q_sources) for i in top)
    # wider beam on the same shard: does recall grow with hnsw_ef (a search-time knob)?
    out["hnsw_ef_sweep"] = ef_sweep(store, queries[:nr], q_sources[:nr], truth_plain, truth_filt,
                                    cfg["k"], cfg["ef_sweep"])
    store.close()
    out["rss_end"] = proc_status()
    return out


def ef_sweep(store, queries, q_sources, truth_plain, truth_filt, k: int, efs: list[int]) -> dict:
    if not efs:
        return {}
    import qdrant_edge as qe
    shard = store.client._shard(COLLECTION)
    out = {}
    variants = [(str(ef), qe.SearchParams(hnsw_ef=ef)) for ef in efs]
    variants += [("exact", qe.SearchParams(exact=True)),
                 ("acorn", qe.SearchParams(acorn=qe.AcornSearchParams(enable=True)))]
    if QUANTIZED["on"]:
        variants.append(("rescore x2", qe.SearchParams(quantization=qe.QuantizationSearchParams(
            rescore=True, oversampling=2.0))))
    for ef, params in variants:
        plain_ms, filt_ms, pt, ft = [], [], [], []
        for qv, s in zip(queries, q_sources):
            for flt, ms, tops in ((None, plain_ms, pt), (source_id(s), filt_ms, ft)):
                f = None if flt is None else qe.Filter(
                    must=[qe.FieldCondition("source_id", match=qe.MatchAny([flt]))])
                t = time.perf_counter()
                res = shard.query(qe.QueryRequest(limit=k, query=qe.Query.Nearest(qv.tolist()),
                                                  filter=f, with_payload=["chunk_id"], with_vector=False,
                                                  params=params))
                ms.append((time.perf_counter() - t) * 1000)
                tops.append([index_of(p.payload["chunk_id"]) for p in res])
        out[ef] = {"plain_p50_ms": percentile(plain_ms, 50), "plain_p95_ms": percentile(plain_ms, 95),
                        "filtered_p50_ms": percentile(filt_ms, 50),
                        "filtered_p95_ms": percentile(filt_ms, 95),
                        "recall_plain": recall(pt, truth_plain, k)["mean"],
                        "recall_filtered": recall(ft, truth_filt, k)["mean"]}
    return out


def child_reopen(cfg: dict) -> dict:
    """A fresh process: open the folder, answer one query, then the timed queries; its RSS."""
    DATA.update(cfg["data"])
    n, seed, ns = cfg["n"], cfg["seed"], cfg["sources"]
    out: dict = {"rss_start": proc_status()}
    t0 = time.perf_counter()
    import qdrant_client.models  # noqa: F401  (QdrantStore imports it on open; a server has it)
    import qdrant_edge  # noqa: F401
    from mtrag_resources.stores.qdrant_store import QdrantStore
    import_s = time.perf_counter() - t0
    out["rss_after_import"] = proc_status()
    queries, origin = make_queries(seed, n, cfg["queries"], cfg["noise"])
    q_sources = [source_of(int(j), n, ns) for j in origin]
    t0 = time.perf_counter()
    store = QdrantStore(path=Path(cfg["path"]), engine="edge")
    open_s = time.perf_counter() - t0
    hits = store.search(KIND, queries[0], k=cfg["k"], payload_fields=[])
    first_s = time.perf_counter() - t0
    assert hits, "no hits after reopen"
    out.update({"import_s": import_s, "open_s": open_s, "to_first_query_s": first_s,
                "rss_after_first_query": proc_status()})
    q = run_queries(store, queries, q_sources, cfg["k"])
    out["query"] = {k: v for k, v in q.items() if not k.startswith("_")}
    out["rss_after_queries"] = proc_status()
    store.close()
    return out


def run_child(mode: str, cfg: dict, timeout: float) -> dict:
    proc = subprocess.run([sys.executable, __file__, f"--_child={mode}", json.dumps(cfg)],
                          stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout, cwd=REPO)
    line = next((ln for ln in proc.stdout.splitlines()[::-1] if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{mode} child failed ({proc.returncode}): {proc.stdout[-2000:]}")
    return json.loads(line[7:])


# ------------------------------------------------------------------------------------------
def print_table(result: dict) -> None:
    sizes = sorted(result["sizes"], key=lambda key: (result["sizes"][key].get("n", 0), key))
    rows = [
        ("upsert (s)", lambda d: d["upsert"]["seconds"], ".1f"),
        ("upsert (points/s)", lambda d: d["upsert"]["points_per_s"], ".0f"),
        ("  without data gen.", lambda d: d["upsert"]["points_per_s_without_generation"], ".0f"),
        ("optimize/HNSW (s)", lambda d: d["optimize"]["seconds"], ".1f"),
        ("optimize CPU (s)", lambda d: d["optimize"]["cpu_s"], ".1f"),
        ("optimize CPU/wall", lambda d: d["optimize"]["cpu_per_wall"], ".2f"),
        ("  HNSW build threads", lambda d: sum(
            1 for k, v in d["optimize_threads"]["cpu_s_by_thread_name"].items()
            if k.startswith("hnsw") and v >= 1), "d"),
        ("  peak RssAnon (MB)", lambda d: d["optimize_threads"]["peak_mb"]["RssAnon_mb"], ".0f"),
        ("segments / indexed", lambda d: f"{d['shard_after_optimize']['segments']} / "
                                         f"{d['shard_after_optimize']['indexed_vectors']}", "s"),
        ("plain p50 (ms)", lambda d: d["query"]["plain_ms"]["p50"], ".2f"),
        ("plain p95 (ms)", lambda d: d["query"]["plain_ms"]["p95"], ".2f"),
        ("filtered p50 (ms)", lambda d: d["query"]["filtered_ms"]["p50"], ".2f"),
        ("filtered p95 (ms)", lambda d: d["query"]["filtered_ms"]["p95"], ".2f"),
        ("plain+payload p95 (ms)", lambda d: d["query"]["plain_full_payload_ms"]["p95"], ".2f"),
        ("recall@10 plain", lambda d: d["recall_at_10"]["plain"]["mean"], ".3f"),
        ("recall@10 filtered", lambda d: d["recall_at_10"]["filtered"]["mean"], ".3f"),
        ("origin at rank 1", lambda d: d["origin_at_rank1"]["plain"], ".3f"),
        ("reopen->1st query (s)", lambda d: d["reopen"]["to_first_query_s"], ".3f"),
        ("  + imports (s)", lambda d: d["reopen"]["import_s"], ".3f"),
        ("reopened plain p95 (ms)", lambda d: d["reopen"]["query"]["plain_ms"]["p95"], ".2f"),
        ("reopened filt. p95 (ms)", lambda d: d["reopen"]["query"]["filtered_ms"]["p95"], ".2f"),
        ("writer peak RSS (MB)", lambda d: d["rss_end"]["VmHWM_mb"], ".0f"),
        ("reader RSS (MB)", lambda d: d["reopen"]["rss_after_queries"]["VmRSS_mb"], ".0f"),
        ("reader peak RSS (MB)", lambda d: d["reopen"]["rss_after_queries"]["VmHWM_mb"], ".0f"),
        ("disk allocated (MB)", lambda d: d["disk"]["allocated_mb"], ".0f"),
        ("disk apparent (MB)", lambda d: d["disk"]["apparent_mb"], ".0f"),
    ]
    print(f"\nQdrant Edge through QdrantStore, {DIM}-d, k={result['k']}, {result['queries']} queries, "
          f"filter = 1 of {result['sources']} sources; qdrant-edge-py {result['versions']['qdrant-edge-py']}")
    print(f"{'':26}" + "".join(f"{n:>14}" for n in sizes))
    for label, get, fmt in rows:
        cells = []
        for n in sizes:
            try:
                v = get(result["sizes"][n])
                cells.append(f"{v:>14{fmt}}" if fmt != "s" else f"{v:>14}")
            except (KeyError, TypeError):
                cells.append(f"{'-':>14}")
        print(f"{label:26}" + "".join(cells))
    for n in sizes:
        sw = result["sizes"][n].get("hnsw_ef_sweep") or {}
        if sw:
            print(f"{n}: hnsw_ef sweep (recall plain/filtered, p95 plain/filtered ms): " + "; ".join(
                f"{ef}: {v['recall_plain']:.3f}/{v['recall_filtered']:.3f}, "
                f"{v['plain_p95_ms']:.1f}/{v['filtered_p95_ms']:.1f}" for ef, v in sw.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--out", type=Path, default=REPO / "bench/out/vector_curve.json")
    ap.add_argument("--merge", action="store_true",
                    help="keep the sizes of an existing --out that this run does not measure")
    ap.add_argument("--work", type=Path, default=REPO / "bench/out/vector-curve-work")
    ap.add_argument("--keep", action="store_true", help="keep each size's folder")
    ap.add_argument("--writer", choices=("client", "write_source"), default="client")
    ap.add_argument("--batch-size", type=int, default=256, help="points per upsert (mtrag's default)")
    ap.add_argument("--sources", type=int, default=10)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--recall-queries", type=int, default=50)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--noise", type=float, default=0.5,
                    help="query = stored vector + noise of this norm, renormalised")
    ap.add_argument("--ef-sweep", default="64,128,256",
                    help="hnsw_ef values to re-run the recall queries with ('' for none)")
    ap.add_argument("--exact-before", action="store_true",
                    help="also time 20 queries before optimize (plain segments, exact scan)")
    ap.add_argument("--data", choices=("spectrum", "uniform"), default="spectrum",
                    help="spectrum (default): random vectors shaped like mtrag's MiniLM vectors; "
                         "uniform: independent random unit vectors (the hardest case)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="bench experiment, not mtrag's config: change the shard config's "
                         "m, ef_construct, payload_m, full_scan_threshold, max_indexing_threads, "
                         "default_segment_number, max_segment_size, indexing_threshold, "
                         "vectors_in_ram=1, int8=1 (scalar int8 quantization kept in RAM), "
                         "no_index=repository+source_kind (keyword indexes QdrantStore would not make)")
    ap.add_argument("--label", default=None, help="key suffix in the JSON (e.g. for an --override run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=7200, help="seconds per size")
    ap.add_argument("--table", action="store_true", help="print the table of --out and exit")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()

    if args._child == "sample":
        pid, stop, out = json.loads(rest[0])
        sample_threads(int(pid), Path(stop), Path(out))
        return 0
    if args._child:
        cfg = json.loads(rest[0])
        res = child_build(cfg) if args._child == "build" else child_reopen(cfg)
        print("RESULT " + json.dumps(res, default=str), flush=True)
        return 0

    if args.table:
        if not args.out.exists():
            raise SystemExit(f"{args.out}: no figures yet; run `bench/vector_curve.py` first (or pass --out FILE)")
        print_table(json.loads(args.out.read_text()))
        return 0
    from importlib.metadata import version
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    overrides = {}
    for kv in args.override:
        key, _, val = kv.partition("=")
        overrides[key.strip()] = int(val) if val.strip().lstrip("-").isdigit() else val.strip()
    keys = [f"{n}{'-' + args.label if args.label else ''}" for n in sizes]
    result: dict = {"bench": "vector_curve", "dim": DIM, "k": args.k, "queries": args.queries,
                    "recall_queries": args.recall_queries, "sources": args.sources,
                    "noise": args.noise, "seed": args.seed, "writer": args.writer,
                    "batch_size": args.batch_size, "data": args.data,
                    "versions": {"qdrant-edge-py": version("qdrant-edge-py"), "numpy": np.__version__},
                    "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                "nice": os.nice(0), "platform": platform.platform(),
                                "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                                "loadavg_start": os.getloadavg()},
                    "sizes": {}}
    if args.merge and args.out.is_file():
        old = json.loads(args.out.read_text())
        result["sizes"].update({n: d for n, d in old.get("sizes", {}).items() if n not in keys})
    done: list[tuple[int, float, float]] = []  # (n, optimize CPU s, CPU/wall)
    for n, key in zip(sizes, keys):
        if done:
            log(projection(done, n))
        path = args.work / f"n{n}"
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        cfg = {"n": n, "seed": args.seed, "batch_size": args.batch_size, "sources": args.sources,
               "queries": args.queries, "recall_queries": min(args.recall_queries, args.queries),
               "k": args.k, "noise": args.noise, "path": str(path), "writer": args.writer,
               "exact_before": args.exact_before,
               "ef_sweep": [int(x) for x in args.ef_sweep.split(",") if x.strip()],
               "data": {"kind": args.data}, "overrides": overrides}
        log(f"size {n:,}: building in {path}")
        t0 = time.perf_counter()
        d = run_child("build", cfg, args.timeout)
        d["reopen"] = run_child("reopen", cfg, args.timeout)
        d["wall_s"] = time.perf_counter() - t0
        d["loadavg_end"] = os.getloadavg()
        d.update(n=n, data=args.data, overrides=overrides)
        result["sizes"][key] = d
        done.append((n, d["optimize"]["cpu_s"], d["optimize"]["cpu_per_wall"] or 1.0))
        if not args.keep:
            shutil.rmtree(path, ignore_errors=True)
            path.with_name(path.name + ".mtrag.lock").unlink(missing_ok=True)
        write_json_quiet(args.out, result)
        log(f"size {n:,} done in {d['wall_s']:.0f} s")
    print_table(result)
    print(f"wrote {args.out}")
    return 0


def projection(done: list[tuple[int, float, float]], n: int) -> str:
    """Optimize CPU at n from the sizes measured so far: N log N from the last one (the textbook
    HNSW cost, optimistic: measured here it grows faster), and the power law of the last two."""
    pn, pc, ratio = done[-1]
    nlogn = pc * (n / pn) * (math.log(n) / math.log(pn))
    msg = f"optimize at {n:,}: from {pn:,} ({pc:.0f} CPU s) N log N ~{nlogn:.0f} CPU s"
    if len(done) >= 2 and done[-2][0] != pn and done[-2][1] > 0:
        qn, qc, _ = done[-2]
        exp = math.log(pc / qc) / math.log(pn / qn)
        power = pc * (n / pn) ** exp
        msg += f"; N^{exp:.2f} (from {qn:,}) ~{power:.0f} CPU s"
    else:
        power = nlogn
    return msg + f"; at this run's CPU/wall {ratio:.2f}: ~{power / ratio / 60:.0f} min wall"


def write_json_quiet(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
