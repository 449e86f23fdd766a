"""Scale benchmark on Django 5.2.19 from PyPI (`django/**/*.py` as source `django`, `docs/**/*.txt`
as `django-docs`: ~1,540 files, ~21k embedded chunks, 9x the click + flask bench corpus), on the
embedded defaults, each step its own process:

  full       `mtrag build` on a fresh MTRAG_HOME (skipped with --reuse when one is built)
  nochange   `mtrag build` again
  append     one function appended to django/utils/text.py
  insert     one function inserted in the middle of django/utils/functional.py
  delete     one docs file removed, checked gone from Qdrant, FTS and Neo4j
             (nochange, append, insert and delete run --rounds rounds; the fastest counts, every
             round is in *_rounds_s; each build's publish reports the bytes it wrote)
  server_*   the same rounds again through `mtrag build-server` (`mtrag build`'s default path,
             MTRAG_BUILD_SERVER=auto: a server started on the built home, stopped after):
             server_append_s, server_insert_s, server_delete_s, server_nochange_s, server_ready_s,
             server_rss_mb
  cli        `mtrag query --json` per mode, one process each (wall seconds)
  http       `mtrag serve`, warm, sequential queries per mode: p50 / p95 ms; server RSS
  switch     a client queries the server without pause while `mtrag build` publishes a change:
             the slowest query around the switch, and the first query that saw the new generation
  watch      `mtrag watch` beside `mtrag serve`: appends to django/utils/text.py and three docs
             removals, each timed from the save to its visibility (bench/watch_latency.py)
  At the end the changed and removed files are put back as the rounds found them and built, so a
  --reuse run starts from the same corpus (they used to accumulate: appended functions, removed docs).

Usage: python bench/scale.py [--work bench/out/scale-work] [--out bench/out/scale.json] [--reuse]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.build import gone_everywhere, latest, mtrag_build, run_measured  # noqa: E402
from bench.common import REPO, fetch_sdist, mtrag_env, percentile, rss_mb, wipe_work, write_json  # noqa: E402
from bench.http_load import free_port, peak_rss_mb, request, start_server, stop_server, wait_healthy  # noqa: E402

DJANGO = "django==5.2.19"
SOURCES = ("django", "django-docs")
APPEND_FILE = "django/utils/text.py"
INSERT_FILE = "django/utils/functional.py"
DELETED_DOCS = ["docs/ref/contrib/humanize.txt", "docs/ref/contrib/sitemaps.txt", "docs/ref/contrib/redirects.txt"]
MODES = ("hybrid", "dense", "lexical", "exact")
QUESTIONS = ["how does the ORM build a SQL join for a foreign key", "slugify a unicode string",
             "validate an email address in a form field", "how are database migrations applied",
             "lazy translation of a string", "cache a property on first access",
             "authenticate a user with a password", "render a template with a context"]
WATCH_DELETED_FROM = "docs/howto"  # the fast lane removes its first three files (put back afterwards)
SYMBOLS = ["slugify", "cached_property", "QuerySet.filter", "get_object_or_404", "reverse"]

FUNC = '''

def scale_bench_{kind}_{n}(value):
    """Return the value reversed; added by the scale benchmark, round {n}."""
    return value[::-1]
'''


def prepare(work: Path, reuse: bool) -> tuple[Path, dict]:
    corpus = work / "corpus"
    home = work / "home"
    if not (reuse and (home / "08-manifest" / "CURRENT").exists()):
        wipe_work(work)
        work.mkdir(parents=True)
        sdist = fetch_sdist(DJANGO, work / "sdists")
        for part in ("django", "docs"):
            shutil.copytree(sdist / part, corpus / part)
        reuse = False
    sources = work / "sources.yaml"
    sources.write_text(
        "sources:\n"
        f"  - {{id: django, kind: code, path: {corpus}, include: ['django/**/*.py']}}\n"
        f"  - {{id: django-docs, kind: docs, path: {corpus}, include: ['docs/**/*.txt']}}\n")
    return corpus, {"env": mtrag_env(home, sources), "home": home, "reused": reuse}


def publish_figures(env: dict) -> dict:
    meta = latest(env, "index_manifest", None)
    return {k: meta.get(k) for k in ("generation", "qdrant_publish_bytes_written", "qdrant_publish_bytes_shared",
                                     "qdrant_publish_files_copied", "qdrant_publish_files_linked",
                                     "qdrant_publish_seconds", "seconds")}


def links_figures(env: dict) -> dict:
    """How the last links stage went: the files whose references it resolved, the links it kept as
    they were (a docs-only change resolves the changed files alone), its seconds."""
    meta = latest(env, "cross_source_links", None)
    return {"links_files_resolved": meta.get("files_resolved"), "links_reused": meta.get("links_reused"),
            "links_seconds": meta.get("seconds")}


def timed_build(env: dict) -> dict:
    run = mtrag_build(env)
    return {"wall": run["wall"], "peak_rss_mb": run["peak_rss_mb"], **publish_figures(env), **links_figures(env)}


def edit_rounds(corpus: Path, env: dict, rounds: int, originals: dict) -> dict:
    """The change rounds; `originals` gets each file's content before the rounds changed or removed
    it (main puts them back at the end, so that a --reuse run starts from the same corpus)."""
    out: dict = {k: [] for k in ("nochange", "append", "insert", "delete")}
    for rel in (APPEND_FILE, INSERT_FILE):
        originals.setdefault(rel, (corpus / rel).read_bytes())
    for n in range(rounds):
        print(f"round {n + 1}: no change, append, insert, delete ...", flush=True)
        out["nochange"].append(timed_build(env))
        target = corpus / APPEND_FILE
        target.write_text(target.read_text() + FUNC.format(kind="appended", n=n))
        out["append"].append(timed_build(env))
        target = corpus / INSERT_FILE
        lines = target.read_text().splitlines(keepends=True)
        defs = [i for i, line in enumerate(lines) if line.startswith("def ")]
        mid = defs[len(defs) // 2]
        target.write_text("".join(lines[:mid]) + FUNC.format(kind="inserted", n=n).lstrip("\n") + "\n\n"
                          + "".join(lines[mid:]))
        out["insert"].append(timed_build(env))
        # a docs file still there (a --reuse run finds the earlier runs' deletions gone)
        doc = next(d for d in DELETED_DOCS + sorted(p.relative_to(corpus).as_posix()
                                                    for folder in ("docs/ref/contrib", "docs/ref")
                                                    for p in (corpus / folder).rglob("*.txt"))
                   if (corpus / d).exists())
        originals.setdefault(doc, (corpus / doc).read_bytes())
        (corpus / doc).unlink()
        step = timed_build(env)
        step["gone_everywhere"] = gone_everywhere(env, "django-docs", doc)
        out["delete"].append(step)
    result: dict = {}
    for step, runs in out.items():
        result[f"{step}_rounds_s"] = [r["wall"] for r in runs]
        result[f"{step}_s"] = min(r["wall"] for r in runs)
        result[f"{step}_publish"] = runs
    result["deleted_everywhere"] = all(r["gone_everywhere"] for r in out["delete"])
    return result


def server_rounds(corpus: Path, env: dict, rounds: int, originals: dict) -> dict:
    """edit_rounds through a build server (`mtrag build` hands a build to the home's server where
    one runs: the default path), as `server_*` keys, with the server's start-up and RSS."""
    print("mtrag build-server ...", flush=True)
    cli = [sys.executable, "-m", "mtrag_assets.app.cli"]
    started = json.loads(run_measured([*cli, "build-server", "start", "--json"], env)["output"])
    try:
        result = {f"server_{k}": v for k, v in edit_rounds(corpus, env, rounds, originals).items()}
        result["server_ready_s"] = started["ready_s"]
        result["server_rss_mb"] = rss_mb(started["pid"])
    finally:
        run_measured([*cli, "build-server", "stop"], env)
    return result


def cli_latency(env: dict) -> dict:
    out = {}
    for mode in MODES:
        text = SYMBOLS[0] if mode == "exact" else QUESTIONS[0]
        walls = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "query", "--json", "--mode", mode, text],
                           env=env, capture_output=True, text=True, check=True)
            walls.append(time.perf_counter() - t0)
        out[mode] = {"min_s": round(min(walls), 3), "median_s": round(statistics.median(walls), 3)}
    return out


def http_latency(port: int, n: int) -> dict:
    out = {}
    for mode in MODES:
        texts = SYMBOLS if mode == "exact" else QUESTIONS
        for text in texts:  # warm: embedder loaded, pages touched
            request(port, "/v1/query", {"query": text, "mode": mode, "k": 10}, 60)
        ms = []
        for i in range(n):
            t0 = time.perf_counter()
            status, _ = request(port, "/v1/query", {"query": texts[i % len(texts)], "mode": mode, "k": 10}, 60)
            ms.append((time.perf_counter() - t0) * 1000)
            assert status == 200, status
        out[mode] = {"p50_ms": round(percentile(ms, 50), 1), "p95_ms": round(percentile(ms, 95), 1)}
    return out


def switch_latency(port: int, corpus: Path, env: dict) -> dict:
    """Queries without pause while a build publishes an appended function: every query's latency
    and generation; the switch is where the generation changes."""
    samples: list[tuple[float, float, int]] = []
    stop = threading.Event()

    def client() -> None:
        i = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            status, body = request(port, "/v1/query", {"query": QUESTIONS[i % len(QUESTIONS)], "k": 10}, 60)
            generation = json.loads(body).get("generation") if status == 200 else f"HTTP {status}"
            samples.append((t0, (time.perf_counter() - t0) * 1000, generation))
            i += 1

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    time.sleep(2)
    target = corpus / APPEND_FILE
    target.write_text(target.read_text() + FUNC.format(kind="switched", n=0))
    build = mtrag_build(env)
    time.sleep(3)
    stop.set()
    thread.join(timeout=60)
    before = samples[0][2]
    first_new = next((i for i, s in enumerate(samples) if s[2] != before), None)
    if first_new is None:
        return {"switched": False, "queries": len(samples), "build_s": build["wall"]}
    window = samples[max(0, first_new - 5): first_new + 5]
    return {"switched": True, "errors": sum(isinstance(g, str) for _, _, g in samples), "queries": len(samples), "build_s": build["wall"],
            "switch_max_ms": round(max(ms for _, ms, _ in window), 1),
            "first_new_generation_query_ms": round(samples[first_new][1], 1),
            "all_p50_ms": round(percentile([ms for _, ms, _ in samples], 50), 1),
            "all_max_ms": round(max(ms for _, ms, _ in samples), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=str(REPO / "bench/out/scale-work"))
    ap.add_argument("--out", default=str(REPO / "bench/out/scale.json"))
    ap.add_argument("--reuse", action="store_true", help="keep --work's built home (skip the full build)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--http-queries", type=int, default=100)
    ap.add_argument("--watch-edits", type=int, default=10)
    args = ap.parse_args()
    corpus, ctx = prepare(Path(args.work).resolve(), args.reuse)  # relative: see build.py
    env, home = ctx["env"], ctx["home"]
    result: dict = {"corpus": DJANGO, "sources": list(SOURCES)}
    if not ctx["reused"]:
        print("full build ...", flush=True)
        full = timed_build(env)
        result.update(full_s=full["wall"], full_peak_rss_mb=full["peak_rss_mb"], full_publish=full)
        result["stage_seconds"] = {s: {a: latest(env, a, s).get("seconds") for a in
                                       ("raw_source", "cas_chunks", "canonical_graph", "embedding_cache",
                                        "qdrant_collection", "fts_db", "neo4j_graph")} for s in SOURCES}
    result["embedded_chunks"] = {s: latest(env, "qdrant_collection", s).get("points") for s in SOURCES}
    result["chunks"] = {s: latest(env, "cas_chunks", s).get("chunks") for s in SOURCES}
    neo = [latest(env, "neo4j_graph", s) for s in SOURCES]
    result["neo4j"] = [{k: n.get(k) for k in ("total_relationships", "seconds", "relationships_per_s")} for n in neo]
    originals: dict[str, bytes] = {}  # what the rounds and the switch change, put back at the end
    result.update(edit_rounds(corpus, env, args.rounds, originals))
    result.update(server_rounds(corpus, env, args.rounds, originals))
    print("CLI queries ...", flush=True)
    result["cli_query"] = cli_latency(env)
    port = free_port()
    server = start_server(home, port)
    try:
        wait_healthy(server, port, 300)
        print("HTTP queries ...", flush=True)
        result["http"] = http_latency(port, args.http_queries)
        result["serve_rss_mb"] = peak_rss_mb(server.pid)
        print("reader switch ...", flush=True)
        result["switch"] = switch_latency(port, corpus, env)
        result["serve_rss_after_switch_mb"] = peak_rss_mb(server.pid)
    finally:
        stop_server(server)
    # The fast lane at django scale (issue #15: its targets hold on the 10x corpus too).
    print("mtrag watch ...", flush=True)
    from bench.watch_latency import measure as measure_watch
    removals = sorted(p.relative_to(corpus).as_posix() for p in (corpus / WATCH_DELETED_FROM).glob("*.txt"))[:3]
    # The watch appends to APPEND_FILE and removes the docs: put back afterwards and built, so
    # that a later --reuse run starts from the corpus it measured and its no-change build is one
    kept = {rel: (corpus / rel).read_bytes() for rel in [APPEND_FILE, *removals]}
    try:  # the figures above are kept whatever happens here
        result.update(measure_watch(env, home, corpus, APPEND_FILE, [("django-docs", d, d) for d in removals],
                                    args.watch_edits))
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        result["watch_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for rel, data in {**kept, **originals}.items():  # the corpus as the rounds found it
            (corpus / rel).write_bytes(data)
        run_measured([sys.executable, "-m", "mtrag_assets.app.cli", "build"], env)
    run_measured([sys.executable, "-m", "mtrag_assets.app.cli", "neo4j", "stop"], env)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
