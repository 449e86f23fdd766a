"""Query latency through the HTTP server, warm: p50 / p95 per mode (dense, lexical, exact, hybrid,
bundles, paths) over at least 200 queries each, on an already built MTRAG_HOME.

Queries come from the index itself: symbols of the published code chunks (exact, paths), their
docstring first sentences (dense, hybrid, bundles, lexical). Also reports the server's peak RSS.

Usage: python bench/query.py --home bench/out/build-work/home [--n 200] [--out bench/out/query.json]
       python bench/query.py --home bench/out/eval-zh-work/home --questions bench/eval/zh_questions.yaml
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, percentile, write_json  # noqa: E402


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def query_set(home: Path, n: int, seed: int) -> tuple[list[str], list[str]]:
    """(symbols, sentences) drawn from the published chunk tables."""
    from mtrag_resources.stores.cas import ContentStore
    from mtrag_resources.publish.manifest import load_current
    from mtrag_resources.stores.tables import read_rows
    manifest = load_current(home / "08-manifest")
    cas = ContentStore(home / "02-cas")
    symbols, sentences = [], []
    for sid, entry in manifest["sources"].items():
        for r in read_rows(home / "02-cas" / "tables" / sid / "chunks"):
            if r["role"] != "child":
                continue
            if entry["kind"] == "code" and r["chunk_type"] in ("function", "method"):
                symbols.append(r["symbol"])
            summary = (r["summary"] or "").strip()
            if len(summary.split()) >= 5:
                sentences.append(summary)
    rng = random.Random(seed)
    rng.shuffle(symbols)
    rng.shuffle(sentences)
    return (symbols * 3)[:n], (sentences * 3)[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", default=str(REPO / "bench/out/build-work/home"))
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", default=str(REPO / "bench/out/query.json"))
    ap.add_argument("--questions", help="a question file (bench/eval/zh_questions.yaml) whose questions replace "
                                        "the docstring sentences: e.g. the Chinese set on a home built by zh.py, "
                                        "so hybrid runs both embedders")
    args = ap.parse_args()
    home = Path(args.home).resolve()
    symbols, sentences = query_set(home, args.n, args.seed)
    if args.questions:
        import yaml
        questions = [q["question"] for q in yaml.safe_load(Path(args.questions).read_text())["questions"]]
        sentences = (questions * (args.n // len(questions) + 1))[:args.n]
        symbols = symbols or sentences
    port = free_port()
    env = dict(os.environ, MTRAG_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    server = subprocess.Popen([sys.executable, "-m", "mtrag_assets.app.cli", "serve", "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/healthz", timeout=2)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError("server did not start")
                time.sleep(0.3)
        for mode in ("hybrid", "dense", "lexical", "exact", "bundles"):  # warm every path once
            post(base + "/v1/query", {"text": sentences[0], "mode": mode})
        post(base + "/v1/paths", {"from": symbols[0], "rel": "CALLS"})
        plan = {"dense": sentences, "lexical": sentences, "exact": symbols, "hybrid": sentences, "bundles": sentences}
        p50, p95, errors = {}, {}, {}
        for mode, texts in list(plan.items()) + [("paths", symbols)]:
            lat, errs = [], 0
            for text in texts:
                t0 = time.perf_counter()
                try:
                    if mode == "paths":
                        post(base + "/v1/paths", {"from": text, "rel": "CALLS", "max_hops": 3})
                    else:
                        post(base + "/v1/query", {"text": text, "mode": mode, "k": 10})
                except OSError:
                    errs += 1
                lat.append((time.perf_counter() - t0) * 1000)
            p50[mode], p95[mode], errors[mode] = round(percentile(lat, 50), 2), round(percentile(lat, 95), 2), errs
            print(f"{mode:8s} n={len(texts)} p50={p50[mode]:.1f} ms p95={p95[mode]:.1f} ms errors={errs}", flush=True)
        import psutil
        rss_mb = psutil.Process(server.pid).memory_info().rss / 2**20
        peak = 0.0
        with open(f"/proc/{server.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
        write_json(args.out, {"n_per_mode": args.n, "p50_ms": p50, "p95_ms": p95, "errors": errors,
                              "server_rss_mb": round(rss_mb, 1), "server_peak_rss_mb": round(peak, 1)})
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
