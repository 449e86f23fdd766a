"""Benchmark the FTS store: write N synthetic chunk rows (children + 1 parent per 10 children,
mixed English identifiers and Chinese prose) into a fresh SQLite file, rewrite it (idempotent
skip), then time search and exact queries.

    python bench/fts_write.py --out bench/out/fts_write.json [--rows 20000] [--queries 200]
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrag_resources.stores.fts_store import FtsStore  # noqa: E402

WORDS = ("cart order invoice payment tax rate lookup cache session token user account shop "
         "price discount region currency render template parse config loader handler").split()
ZH = ("税率 内存 鉴权 中间件 缓存 订单 支付 用户 会话 配置 解析 模板 地区 货币 折扣 请求 "
      "响应 数据库 索引 查询").split()


def vocabulary(rnd: random.Random, n: int = 5000) -> tuple[list[str], list[float]]:
    """Pseudo-words with Zipf weights, so posting lists look like real text, not 22 words."""
    syl = ["ka", "ro", "mi", "tu", "sen", "dor", "va", "lix", "pe", "qua", "zen", "bo", "tri", "ul"]
    words = sorted({"".join(rnd.choices(syl, k=rnd.randint(2, 4))) for _ in range(n * 2)})[:n]
    rnd.shuffle(words)
    return words, [1.0 / (r + 1) for r in range(len(words))]


def make_rows(n_children: int, seed: int = 7) -> list[dict]:
    rnd = random.Random(seed)
    vocab, weights = vocabulary(rnd)
    n_parents = max(1, n_children // 10)
    rows = []
    for p in range(n_parents):
        rows.append({"chunk_id": f"p{p}", "role": "parent", "chunk_type": "file",
                     "file_path": f"src/pkg{p % 50}/mod{p}.py", "symbol": f"pkg{p % 50}.mod{p}",
                     "title": f"mod{p}.py", "text": f"module {p} " + " ".join(rnd.choices(WORDS, k=200)),
                     "source_kind": "code", "language": "python", "start_line": 1, "end_line": 400})
    for i in range(n_children):
        p = i % n_parents
        a, b = rnd.sample(WORDS, 2)
        name = f"{a}_{b}_{i}"
        cls = f"{a.title()}{b.title()}{i % 97}"
        body = " ".join(rnd.choices(vocab, weights, k=50) + rnd.choices(WORDS, k=10))
        zh = "".join(rnd.choices(ZH, k=12))
        rows.append({"chunk_id": f"c{i}", "role": "child", "parent_id": f"p{p}",
                     "chunk_type": "method", "file_path": f"src/pkg{p % 50}/mod{p}.py",
                     "symbol": f"pkg{p % 50}.mod{p}.{cls}.{name}", "title": name,
                     "summary": f"{a} {b} 的{zh[:6]}", "text": f"def {name}(self):\n    # {zh}\n    {body}",
                     "source_kind": "code", "language": "python", "start_line": 10, "end_line": 40,
                     "graph_ids": [f"fn:{i}"]})
    return rows


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=20_000, help="child rows (parents add 10%%)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--db", default="", help="SQLite file (default: a temporary one)")
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory()
    db = Path(args.db) if args.db else Path(tmp.name) / "fts.sqlite"
    if db.exists():
        db.unlink()
    rows = make_rows(args.rows)
    store = FtsStore(db)
    w1 = store.write_source("bench", "g1", "sha-1", rows, None)
    w2 = store.write_source("bench", "g1", "sha-1", rows, None)        # skipped
    changed = [dict(r, text=r["text"] + " edited") if i % 20 == 0 else r for i, r in enumerate(rows)]
    w3 = store.write_source("bench", "g2", "sha-2", changed, None)     # 5% of rows changed
    rows = [dict(r, text=r["text"] + " v3") for r in rows]
    w4 = store.write_source("bench", "g3", "sha-3", rows, None)        # every row changed

    rnd = random.Random(1)
    qsets = {
        "en_words": lambda: " ".join(rnd.sample(WORDS, 2)),
        "identifier_fragment": lambda: f"{rnd.choice(WORDS)}_{rnd.choice(WORDS)[:3]}",
        "zh_2char": lambda: rnd.choice(ZH)[:2],
        "zh_sentence": lambda: "如何" + rnd.choice(ZH) + "的" + rnd.choice(ZH),
        "no_hit": lambda: "zzqxv_nothing",
    }
    timings: dict[str, dict] = {}
    for name, gen in qsets.items():
        ts, nhits = [], []
        for _ in range(args.queries):
            q = gen()
            t = time.perf_counter()
            hits = store.search(q, k=20)
            ts.append((time.perf_counter() - t) * 1000)
            nhits.append(len(hits))
        timings[f"search_{name}"] = {"p50_ms": pct(ts, 0.5), "p95_ms": pct(ts, 0.95),
                                     "mean_hits": statistics.mean(nhits)}
    ts = []
    for _ in range(args.queries):
        i = rnd.randrange(args.rows)
        t = time.perf_counter()
        store.exact(rows[args.rows // 10 + i]["symbol"])
        ts.append((time.perf_counter() - t) * 1000)
    timings["exact_symbol"] = {"p50_ms": pct(ts, 0.5), "p95_ms": pct(ts, 0.95)}

    result = {
        "rows": len(rows), "child_rows": w1["child_rows"], "parent_rows": w1["parent_rows"],
        "alias_rows": w1["alias_rows"], "db_bytes": w4["bytes"],
        "first_write_s": w1["seconds"], "first_write_rows_per_s": w1["rows_per_s"],
        "skip_rewrite_s": w2["seconds"], "skipped": w2["skipped"],
        "replace_5pct_changed_s": w3["seconds"], "replace_5pct_changed": {
            k: w3[k] for k in ("kept_rows", "inserted_rows", "deleted_rows")},
        "replace_all_changed_s": w4["seconds"], "replace_all_changed_rows_per_s": w4["rows_per_s"],
        "queries": timings, "sqlite": sqlite3.sqlite_version, "python": platform.python_version(),
    }
    store.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"rows={len(rows)} first write {w1['seconds']:.2f}s ({w1['rows_per_s']:.0f} rows/s), "
          f"skip {w2['seconds'] * 1000:.1f} ms, 5% changed {w3['seconds']:.2f}s, "
          f"all changed {w4['seconds']:.2f}s ({w4['rows_per_s']:.0f} rows/s), db {w4['bytes'] / 1e6:.1f} MB")
    for name, t in timings.items():
        print(f"  {name:28s} p50 {t['p50_ms']:7.2f} ms  p95 {t['p95_ms']:7.2f} ms"
              + (f"  hits {t['mean_hits']:.1f}" if "mean_hits" in t else ""))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
