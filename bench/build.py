"""Build benchmark on the click 8.5.1 + flask 3.1.3 sdists (src and docs), each step its own process:

  embed_only   plain SentenceTransformer.encode (batch 64, same model, same chunk texts) and
               mtrag's Embedder on the same texts, alternating, 2 rounds each, fastest counts
  full         `mtrag build` on a fresh MTRAG_HOME: full_s, full_over_mtrag_embed (against mtrag's
               embedding alone), and the CPU seconds of the build's process tree (full_cpu_s) and of
               the local Neo4j it started (full_neo4j_cpu_s), beside mtrag_embed_only_cpu_s
  nochange     `mtrag build` again
  append       one function with a docstring appended to flask/helpers.py
  insert       one function inserted in the middle of click/utils.py
  delete       one docs file removed (flask docs/signals.rst), checked gone from Qdrant, FTS and Neo4j
  server_*     append, insert, delete and no change again, through `mtrag build-server` (one server
               started on the built home, stopped after): server_append_s, server_insert_s,
               server_delete_s, server_nochange_s, server_ready_s, server_rss_mb
  watch        `mtrag watch` and `mtrag serve` on the built home: 10 appends and 3 docs removals, each
               timed from the save to its visibility in the server's answers (bench/watch_latency.py:
               watch_append_s p50 and watch_append_p95_s, watch_delete_s)
  (nochange, append, insert and delete run three rounds each, a new function or file each time;
  the fastest round counts, every round's time is in *_rounds_s)

Usage: python bench/build.py [--out bench/out/build.json] [--work bench/out/build-work]
The JSON has the keys issue 7 asks for (full_s, embed_only_s, full_over_embed, nochange_s, ...).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, cpu_s, fetch_sdist, mtrag_env, rss_mb, wipe_work, write_json  # noqa: E402
from mtrag_resources.core.config import Settings  # noqa: E402
from mtrag_resources.stores.neo4j_server import Neo4jServer  # noqa: E402

APPENDED = '''

def bench_appended_helper(value: str) -> str:
    """Return the value upper-cased; appended by the build benchmark."""
    return value.upper()
'''
INSERTED = '''def bench_inserted_helper(count: int) -> int:
    """Double a count; inserted mid-file by the build benchmark."""
    return count * 2


'''
EMBED_ONLY = r'''
import json, sys, time
from sentence_transformers import SentenceTransformer
from mtrag_resources.embedding.model_files import default_model_path
texts = json.load(open(sys.argv[1]))
model = SentenceTransformer(str(default_model_path()), device="cpu")
t0 = time.perf_counter()
model.encode(texts, batch_size=64)
print(json.dumps({"seconds": time.perf_counter() - t0, "texts": len(texts)}))
'''

# mtrag's own embedder (length-sorted batches, the backend MTRAG_EMBED_BACKEND selects) on the
# same texts, in its own process like the plain encode: `embed_speedup` compares the two.
MTRAG_EMBED_ONLY = r'''
import json, sys, time
from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig
texts = json.load(open(sys.argv[1]))
embedder = Embedder(EmbedderConfig.from_env())
embedder.encode(texts[:1])  # load before the clock, as the plain run loads before its clock
t0, c0 = time.perf_counter(), time.process_time()
embedder.encode(texts)
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "texts": len(texts)}))
'''


EMBED_ROUNDS = 2
EDIT_ROUNDS = 3
DELETED_DOCS = ["docs/signals.rst", "docs/shell.rst", "docs/lifecycle.rst"]
# The build server's removals, then the fast lane's (bench/watch_latency.py), after the batch rounds.
SERVER_DELETED_DOCS = ["docs/design.rst", "docs/extensiondev.rst", "docs/templating.rst"]
WATCH_DELETED_DOCS = ["docs/views.rst", "docs/gevent.rst", "docs/debugging.rst"]
WATCH_EDITS = 10

PREPARE_EMBEDDER = r'''
from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig
Embedder(EmbedderConfig.from_env()).encode(["export and calibrate once"])
'''


def run_measured(cmd: list[str], env: dict) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{output[-4000:]}")
    return {"wall": round(wall, 3), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "output": output}


def mtrag_build(env: dict) -> dict:
    return run_measured([sys.executable, "-m", "mtrag_assets.app.cli", "build"], env)


def latest(env: dict, asset: str, partition: str | None) -> dict:
    code = f"""
import json, dagster as dg
inst = dg.DagsterInstance.get()
recs = inst.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey({asset!r}),
    asset_partitions={[partition] if partition else None!r}), limit=1).records
meta = recs[0].asset_materialization.metadata if recs else {{}}
def plain(v):  # table / record metadata values are not JSON; their text is enough here
    try:
        return json.loads(json.dumps(v))
    except Exception:
        return str(v)
print(json.dumps({{k: plain(getattr(v, "value", None)) for k, v in meta.items()}}))
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def local_neo4j_cpu(home: Path) -> float | None:
    """CPU seconds the home's local Neo4j has used since it started (None: none runs)."""
    used = cpu_s(Neo4jServer(Settings(home=home))._pid())
    return None if used is None else round(used, 2)


def embedded_total(env: dict, sources: list[str]) -> int:
    return sum(int(latest(env, "embedding_cache", s).get("embedded") or 0) for s in sources)


def gone_everywhere(env: dict, source_id: str, file_path: str) -> bool:
    code = f"""
import json
from mtrag_resources.core.config import Settings
from mtrag_resources.stores.connect import open_fts, open_neo4j, open_qdrant
s = Settings.from_env()
fts = open_fts(s); neo = open_neo4j(s)
with open_qdrant(s) as q:
    hits = q.search("docs", [0.05] * 384, k=5000, filters={{"file_path": {file_path!r}}})
rows = [c for c in fts.exact({file_path!r}) if c["source_id"] == {source_id!r}]
nodes = neo._read("MATCH (n:Entity) WHERE n.source_id = $s AND n.file_path = $f RETURN count(n) AS n", s={source_id!r}, f={file_path!r})[0]["n"]
print(json.dumps({{"qdrant": len(hits), "fts": len(rows), "neo4j": nodes}}))
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    counts = json.loads(out.strip().splitlines()[-1])
    print("after delete:", counts, flush=True)
    return not any(counts.values())


def child_texts(home: Path, sources: list[str]) -> list[str]:
    from mtrag_resources.stores.cas import ContentStore
    from mtrag_resources.stores.tables import read_rows
    cas = ContentStore(home / "02-cas")
    texts = []
    for sid in sources:
        rows = read_rows(home / "02-cas" / "tables" / sid / "chunks")
        texts += [cas.get_text(r["content_hash"]) for r in rows if r["role"] == "child"]
    return texts


def bench_corpus(work: Path, fresh: bool) -> tuple[Path, Path, list[str]]:
    """(corpus, sources file, source ids) of the click + flask bench corpus under `work`; `fresh`
    wipes `work` and copies the pinned sdists' src and docs again."""
    corpus = work / "corpus"
    if fresh:
        wipe_work(work)
        work.mkdir(parents=True)
        for req, name in (("click==8.5.1", "click"), ("flask==3.1.3", "flask")):
            sdist = fetch_sdist(req, work / "sdists")
            for part in ("src", "docs"):
                shutil.copytree(sdist / part, corpus / name / part)
    sources = work / "sources.yaml"
    sources.write_text(
        "sources:\n"
        f"  - {{id: click, kind: code, path: {corpus / 'click'}, include: ['src/**/*.py']}}\n"
        f"  - {{id: click-docs, kind: docs, path: {corpus / 'click'}, include: ['docs/**/*.md', 'docs/**/*.rst']}}\n"
        f"  - {{id: flask, kind: code, path: {corpus / 'flask'}, include: ['src/**/*.py']}}\n"
        f"  - {{id: flask-docs, kind: docs, path: {corpus / 'flask'}, include: ['docs/**/*.rst', 'docs/**/*.md']}}\n")
    return corpus, sources, ["click", "click-docs", "flask", "flask-docs"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "bench/out/build.json"))
    ap.add_argument("--work", default=str(REPO / "bench/out/build-work"))
    ap.add_argument("--reuse", action="store_true",
                    help="keep --work's corpus and its built home (skip the full build; to debug later steps)")
    args = ap.parse_args()
    work = Path(args.work).resolve()  # relative: the sources file and DAGSTER_HOME need absolute paths
    reuse = args.reuse and (work / "home" / "08-manifest" / "CURRENT").exists()
    corpus, sources, ids = bench_corpus(work, fresh=not reuse)
    home = work / "home"
    env = mtrag_env(home, sources)
    result: dict = {}

    # A fresh machine exports (and for int8 calibrates) the model once into ~/.cache/mtrag/onnx/,
    # like a model download: done here, outside the timed build.
    run_measured([sys.executable, "-c", PREPARE_EMBEDDER], env)
    print("full build ...", flush=True)
    full = mtrag_build(env) if not reuse else {"wall": None, "peak_rss_mb": None, "cpu_s": None}
    result["full_s"] = full["wall"]
    result["peak_rss_mb"] = full["peak_rss_mb"]
    # Where the full build's CPU went, against the two cores: the build's process tree (embedding,
    # stages, Dagster) and the local Neo4j it started (a separate session: not in the tree's rusage).
    result["full_cpu_s"] = full["cpu_s"]
    result["full_neo4j_cpu_s"] = None if reuse else local_neo4j_cpu(home)
    result["cores"] = os.cpu_count()
    stage = {s: {a: latest(env, a, s).get("seconds") for a in
                 ("raw_source", "cas_chunks", "canonical_graph", "embedding_cache", "qdrant_collection", "fts_db",
                  "neo4j_graph")} for s in ids}
    stage["global"] = {a: latest(env, a, None).get("seconds") for a in ("cross_source_links", "index_manifest")}
    result["stage_seconds"] = stage
    emb = [latest(env, "embedding_cache", s) for s in ids]
    result["embedded_full"] = sum(int(e["embedded"]) for e in emb)
    mtrag_embed_s = sum(float(e["embed_seconds"]) for e in emb)
    neo = [latest(env, "neo4j_graph", s) for s in ids]
    rels = sum(int(n.get("total_relationships", 0) or 0) for n in neo)
    neo_s = sum(float(n.get("seconds", 0) or 0) for n in neo)
    result["neo4j_rels_per_s"] = round(rels / neo_s, 1) if neo_s else None
    result["chunks"] = {s: latest(env, "cas_chunks", s).get("chunks") for s in ids}

    print("embedding alone ...", flush=True)
    texts = child_texts(home, ids)
    texts_file = work / "texts.json"
    texts_file.write_text(json.dumps(texts))
    # Plain and mtrag alternate for EMBED_ROUNDS rounds, each in a fresh process; the fastest round
    # of each counts (the machine is shared: the fastest round is the least disturbed one).
    plain_docs, ours_docs, walls = [], [], []
    for _ in range(EMBED_ROUNDS):
        plain = run_measured([sys.executable, "-c", EMBED_ONLY, str(texts_file)], env)
        plain_docs.append(json.loads(plain["output"].strip().splitlines()[-1]))
        walls.append(plain["wall"])
        ours = run_measured([sys.executable, "-c", MTRAG_EMBED_ONLY, str(texts_file)], env)
        ours_docs.append(json.loads(ours["output"].strip().splitlines()[-1]))
    plain_doc = min(plain_docs, key=lambda d: d["seconds"])
    ours_doc = min(ours_docs, key=lambda d: d["seconds"])
    result["embed_only_s"] = round(plain_doc["seconds"], 2)
    result["embed_only_rounds_s"] = [round(d["seconds"], 2) for d in plain_docs]
    result["embed_only_wall_s"] = min(walls)
    result["full_over_embed"] = round(result["full_s"] / result["embed_only_s"], 3) if result["full_s"] else None
    result["mtrag_embed_only_s"] = round(ours_doc["seconds"], 2)
    result["mtrag_embed_only_rounds_s"] = [round(d["seconds"], 2) for d in ours_docs]
    result["mtrag_embed_only_cpu_s"] = round(ours_doc["cpu_s"], 2)
    result["full_over_mtrag_embed"] = round(result["full_s"] / ours_doc["seconds"], 3) if result["full_s"] else None
    if result["full_s"]:
        print(f"full build {result['full_s']} s = {result['full_over_mtrag_embed']}x mtrag's embedding alone "
              f"({ours_doc['seconds']:.1f} s, {ours_doc['cpu_s']:.1f} CPU-s); CPU: build {result['full_cpu_s']} s "
              f"+ Neo4j {result['full_neo4j_cpu_s']} s on {result['cores']} cores", flush=True)
    result["embed_speedup"] = round(plain_doc["seconds"] / ours_doc["seconds"], 3)
    # inside the build (model load excluded, other stages' work interleaved): texts/s
    result["build_embed_texts_per_s"] = round(result["embedded_full"] / mtrag_embed_s, 1) if mtrag_embed_s else None
    result["plain_embed_texts_per_s"] = round(plain_doc["texts"] / plain_doc["seconds"], 1)

    print("no change ...", flush=True)
    result["nochange_rounds_s"] = [mtrag_build(env)["wall"] for _ in range(EDIT_ROUNDS)]
    result["nochange_s"] = min(result["nochange_rounds_s"])

    # What the rounds and the watch change or remove, put back (and built) at the end, so that a
    # --reuse run starts from the corpus this one did (the removed docs were gone for good before).
    originals = {rel: (corpus / rel).read_bytes() for rel in
                 ["flask/src/flask/helpers.py", "click/src/click/utils.py",
                  *(f"flask/{d}" for d in [*DELETED_DOCS[:EDIT_ROUNDS], *SERVER_DELETED_DOCS[:EDIT_ROUNDS],
                                           *WATCH_DELETED_DOCS])]}
    try:
        _edit_rounds(corpus, env, home, result)
    finally:
        for rel, data in originals.items():
            (corpus / rel).write_bytes(data)
        run_measured([sys.executable, "-m", "mtrag_assets.app.cli", "build"], env)
    run_measured([sys.executable, "-m", "mtrag_assets.app.cli", "neo4j", "stop"], env)  # the builds started it
    write_json(args.out, result)


def _edit_rounds(corpus: Path, env: dict, home: Path, result: dict) -> None:
    """The change rounds through `mtrag build`, again through a build server, then the fast lane;
    figures into `result`."""
    _change_rounds(corpus, env, result, DELETED_DOCS, prefix="")
    _watch(corpus, env, home, result)
    print("mtrag build-server ...", flush=True)
    cli = [sys.executable, "-m", "mtrag_assets.app.cli"]
    started = json.loads(run_measured([*cli, "build-server", "start", "--json"], env)["output"])
    try:
        _change_rounds(corpus, env, result, SERVER_DELETED_DOCS, prefix="server_")
        result["server_nochange_rounds_s"] = [mtrag_build(env)["wall"] for _ in range(EDIT_ROUNDS)]
        result["server_nochange_s"] = min(result["server_nochange_rounds_s"])
        result["server_ready_s"] = started["ready_s"]
        result["server_rss_mb"] = rss_mb(started["pid"])
    finally:
        run_measured([*cli, "build-server", "stop"], env)


def _change_rounds(corpus: Path, env: dict, result: dict, deleted_docs: list[str], prefix: str) -> None:
    """append, insert and delete, EDIT_ROUNDS each, through `mtrag build` (through the home's build
    server when one runs); `{prefix}append_s` ... into `result`."""
    # Each edit runs EDIT_ROUNDS times (a new function or file each time) and the fastest counts:
    # on a shared machine one run swung by 2-3 s. Every round's figures are kept.
    rounds: dict[str, list] = {"append": [], "insert": [], "delete": []}
    for n in range(EDIT_ROUNDS):
        name = f"{prefix}{n}"
        print(f"{prefix}append {n + 1} ...", flush=True)
        helpers = corpus / "flask" / "src" / "flask" / "helpers.py"
        helpers.write_text(helpers.read_text() + APPENDED.replace("bench_appended_helper", f"bench_appended_helper_{name}"))
        rounds["append"].append((mtrag_build(env)["wall"], embedded_total(env, ["flask"])))

        print(f"{prefix}insert {n + 1} ...", flush=True)
        utils = corpus / "click" / "src" / "click" / "utils.py"
        lines = utils.read_text().splitlines(keepends=True)
        defs = [i for i, l in enumerate(lines) if l.startswith("def ")]
        mid = defs[len(defs) // 2]
        inserted = INSERTED.replace("bench_inserted_helper", f"bench_inserted_helper_{name}")
        utils.write_text("".join(lines[:mid]) + inserted + "".join(lines[mid:]))
        rounds["insert"].append((mtrag_build(env)["wall"], embedded_total(env, ["click"])))

        print(f"{prefix}delete {n + 1} ...", flush=True)
        doc = deleted_docs[n]
        (corpus / "flask" / doc).unlink()
        rounds["delete"].append((mtrag_build(env)["wall"], gone_everywhere(env, "flask-docs", doc)))
    for step, key in (("append", "embedded_after_append"), ("insert", "embedded_after_insert"),
                      ("delete", "deleted_everywhere")):
        result[f"{prefix}{step}_rounds_s"] = [wall for wall, _ in rounds[step]]
        result[f"{prefix}{step}_s"] = min(result[f"{prefix}{step}_rounds_s"])
        values = [value for _, value in rounds[step]]
        # every round must embed exactly one chunk / delete everywhere, not just the fastest
        result[f"{prefix}{key}"] = all(values) if step == "delete" else max(values)


def _watch(corpus: Path, env: dict, home: Path, result: dict) -> None:
    # The fast lane on the same home (issue #15): `mtrag watch` and `mtrag serve` beside it.
    print("mtrag watch ...", flush=True)
    from bench.watch_latency import measure as measure_watch
    result.update(measure_watch(env, home, corpus, "flask/src/flask/helpers.py",
                                [("flask-docs", f"flask/{d}", d) for d in WATCH_DELETED_DOCS], WATCH_EDITS))


if __name__ == "__main__":
    main()
