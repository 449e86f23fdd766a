"""Embedded Qdrant through QdrantStore: write N random points, then time queries.

    python bench/qdrant_write.py --out bench/out/qdrant_write.json [--points 20000] [--dim 384]
                                 [--engine local|edge]   (default: $MTRAG_QDRANT_ENGINE, else local)

Reports upsert points/s (first write), the rewrite of an unchanged source (skipped points),
and query latency p50/p95 plain and filtered by source.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrag_resources.core.models import stable_id  # noqa: E402
from mtrag_resources.stores.qdrant_store import QdrantStore  # noqa: E402
from mtrag_resources.stores.qdrant_folder import ENGINES, engine_from_env


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--points", type=int, default=20_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--sources", type=int, default=4)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--path", type=Path, default=None, help="Qdrant folder (default: a temp dir)")
    ap.add_argument("--engine", choices=ENGINES, default=None,
                    help="embedded engine (default: $MTRAG_QDRANT_ENGINE, else local)")
    args = ap.parse_args()
    engine = args.engine or engine_from_env()

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((args.points, args.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    per_source = args.points // args.sources
    sources: dict[str, list[dict]] = {}
    for s in range(args.sources):
        sid = f"bench-{s}"
        lo, hi = s * per_source, (s + 1) * per_source if s < args.sources - 1 else args.points
        sources[sid] = [{"chunk_id": stable_id(sid, i), "vector": vectors[i],
                         "payload": {"file_path": f"pkg/m{i % 500}.py", "symbol": f"pkg.m.f{i}",
                                     "content_hash": f"{i:064x}", "parent_id": None,
                                     "title": f"f{i}", "repository": "bench"}}
                        for i in range(lo, hi)]

    with tempfile.TemporaryDirectory() as tmp:
        path = args.path or Path(tmp) / "qdrant"
        with QdrantStore(path=path, engine=engine) as store:
            t0 = time.perf_counter()
            for sid, pts in sources.items():
                store.write_source(sid, "code", "g1", pts, batch_size=args.batch_size)
            write_s = time.perf_counter() - t0

            sid0 = next(iter(sources))
            t0 = time.perf_counter()
            rewrite = store.write_source(sid0, "code", "g2", sources[sid0], batch_size=args.batch_size)
            rewrite_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            forced = store.write_source(sid0, "code", "g3", sources[sid0], batch_size=args.batch_size,
                                        skip_unchanged=False)
            forced_s = time.perf_counter() - t0

            queries = rng.standard_normal((args.queries, args.dim)).astype(np.float32)
            store.search("code", queries[0], k=20)
            plain, filtered = [], []
            for q in queries:
                t = time.perf_counter()
                store.search("code", q, k=20)
                plain.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                store.search("code", q, k=20, source_ids=[sid0])
                filtered.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            got = store.vectors_for("code", [p["chunk_id"] for p in sources[sid0][:100]])
            vectors_for_ms = (time.perf_counter() - t) * 1000
            assert len(got) == min(100, len(sources[sid0]))
            total = store.count("code")
        reopen_t = time.perf_counter()
        with QdrantStore(path=path, engine=engine) as store:
            store.count("code")
        reopen_s = time.perf_counter() - reopen_t

    result = {
        "bench": "qdrant_write",
        "mode": "embedded", "engine": engine,
        "points": total, "dim": args.dim, "sources": args.sources, "batch_size": args.batch_size,
        "upsert_seconds": write_s, "upsert_points_per_s": args.points / write_s,
        "unchanged_rewrite": {"points": len(sources[sid0]), "seconds": rewrite_s,
                              "skipped": rewrite["skipped"], "upserted": rewrite["upserted"],
                              "points_per_s": len(sources[sid0]) / rewrite_s},
        "unchanged_rewrite_without_skip": {"seconds": forced_s, "upserted": forced["upserted"]},
        "query_ms": {"plain_p50": percentile(plain, 50), "plain_p95": percentile(plain, 95),
                     "filtered_p50": percentile(filtered, 50),
                     "filtered_p95": percentile(filtered, 95),
                     "median_plain": statistics.median(plain)},
        "vectors_for_100_ms": vectors_for_ms,
        "reopen_seconds": reopen_s,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"engine {engine}")
    print(f"upsert: {args.points} points in {write_s:.1f} s = {args.points / write_s:.0f} points/s")
    print(f"unchanged rewrite of {len(sources[sid0])} points: {rewrite_s:.2f} s "
          f"({rewrite['skipped']} skipped, {rewrite['upserted']} upserted); "
          f"without the skip check: {forced_s:.2f} s")
    print(f"query k=20: plain p50 {result['query_ms']['plain_p50']:.1f} ms, "
          f"p95 {result['query_ms']['plain_p95']:.1f} ms; filtered p50 "
          f"{result['query_ms']['filtered_p50']:.1f} ms, p95 {result['query_ms']['filtered_p95']:.1f} ms")
    print(f"vectors_for(100): {vectors_for_ms:.1f} ms; reopen: {reopen_s:.2f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
