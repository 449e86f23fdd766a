"""Embedding throughput and agreement per backend, against a plain `SentenceTransformer.encode`.

Texts: Python functions and classes from the installed click and dagster packages, cut to 200-300
tokens (chunk-like). Each variant runs in its own process (fresh model, no shared caches), for
`--rounds` rounds interleaved across variants; texts/s is the best round (the machine is shared, so
the best round is the least disturbed one). Agreement is against the plain encode's vectors: cosine per
text (mean, min) and the top-10 overlap of `--queries` docstring queries over the same texts.

    .venv/bin/python bench/embed_backends.py --out bench/out/embed_backends.json
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VARIANTS = {
    "plain": "SentenceTransformer(path).encode(texts, batch_size=64)",
    "embedder-torch": "mtrag Embedder, backend torch (length-sorted batches)",
    "st-onnx": 'SentenceTransformer(path, backend="onnx") (optimum)',
    "embedder-onnx": "mtrag Embedder, backend onnx (fp32, onnxruntime)",
    "embedder-onnx-int8": "mtrag Embedder, backend onnx-int8 (dynamic int8, FFN out fp32)",
    "torch-bf16": "plain encode with the model cast to bfloat16",
}


# ---------------------------------------------------------------------------------------------
# Texts


def _package_dir(name: str) -> Path:
    return Path(importlib.util.find_spec(name).origin).parent


def sample_texts(n: int, n_queries: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """`n` function/class sources cut to 200-300 tokens, and `n_queries` docstring first lines."""
    from tokenizers import Tokenizer

    from mtrag_resources.embedding.model_files import default_model_path

    tok = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    tok.no_truncation()
    rng = random.Random(seed)
    segments: list[str] = []
    docs: list[str] = []
    for pkg in ("click", "dagster"):
        for f in sorted(_package_dir(pkg).rglob("*.py")):
            try:
                src = f.read_text(encoding="utf-8")
                tree = ast.parse(src)
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            lines = src.splitlines()
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    segments.append("\n".join(lines[node.lineno - 1:node.end_lineno]))
                    doc = ast.get_docstring(node) or ""
                    first = doc.strip().split("\n\n")[0].replace("\n", " ")
                    if len(first.split()) >= 6:
                        docs.append(first[:300])
    rng.shuffle(segments)
    texts: list[str] = []
    for seg in segments:
        enc = tok.encode(seg, add_special_tokens=False)
        if len(enc.ids) < 200:
            continue
        cut = rng.randint(200, 300)
        texts.append(seg[:enc.offsets[min(cut, len(enc.ids)) - 1][1]])
        if len(texts) == n:
            break
    return texts, rng.sample(sorted(set(docs)), n_queries)


# ---------------------------------------------------------------------------------------------
# One variant, in its own process


def _encoder(variant: str):
    from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig
    from mtrag_resources.embedding.model_files import default_model_path

    path = str(default_model_path())
    if variant.startswith("embedder-"):
        e = Embedder(EmbedderConfig(batch_size=64, backend=variant.removeprefix("embedder-")))
        return e.encode
    from sentence_transformers import SentenceTransformer

    if variant == "st-onnx":
        model = SentenceTransformer(path, backend="onnx")
    else:
        model = SentenceTransformer(path, device="cpu")
    if variant == "torch-bf16":
        import torch
        model = model.to(torch.bfloat16)
    return lambda texts: model.encode(texts, batch_size=64, normalize_embeddings=True,
                                      convert_to_tensor=True, show_progress_bar=False).float().numpy()


def worker(variant: str, texts_file: str, vecs_file: str) -> None:
    import numpy as np

    data = json.loads(Path(texts_file).read_text())
    t0 = time.perf_counter()
    encode = _encoder(variant)
    encode(data["texts"][:8])  # warm up: first-call allocations and lazy init
    load_s = time.perf_counter() - t0
    w0, c0 = time.perf_counter(), time.process_time()
    vecs = encode(data["texts"])
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    queries = encode(data["queries"])
    np.save(vecs_file, np.concatenate([vecs, queries]).astype(np.float32))
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "load_s": load_s}))


# ---------------------------------------------------------------------------------------------
# Driver


def agreement(base, other, n_texts: int) -> dict:
    import numpy as np

    other = other / np.linalg.norm(other, axis=1, keepdims=True)
    cos = (base[:n_texts] * other[:n_texts]).sum(1)
    def top10(v):
        return np.argsort(-(v[n_texts:] @ v[:n_texts].T), axis=1)[:, :10]
    overlap = [len(set(a) & set(b)) / 10 for a, b in zip(top10(base), top10(other))]
    return {"cos_mean": float(cos.mean()), "cos_min": float(cos.min()),
            "top10_overlap": float(np.mean(overlap))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "bench/out/embed_backends.json"))
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--worker", nargs=3, metavar=("VARIANT", "TEXTS", "VECS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker)

    import numpy as np

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "TOKENIZERS_PARALLELISM": "false"}
    variants = args.variants.split(",")
    texts, queries = sample_texts(args.n, args.queries)
    work = Path(tempfile.mkdtemp(prefix="embed-bench-"))
    (work / "texts.json").write_text(json.dumps({"texts": texts, "queries": queries}))

    # Export / quantize once, outside the timings (a one-off cost per machine and weights).
    t0 = time.perf_counter()
    from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig
    for b in ("onnx", "onnx-int8"):
        if f"embedder-{b}" in variants:
            Embedder(EmbedderConfig(backend=b)).encode(["warm"])
    prepare_s = time.perf_counter() - t0

    runs: dict[str, list[dict]] = {v: [] for v in variants}
    errors: dict[str, str] = {}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for v in variants:
            if v in errors:
                continue
            proc = subprocess.run([sys.executable, __file__, "--worker", v, str(work / "texts.json"),
                                   str(work / f"{v}.npy")], env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                errors[v] = (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]
                print(f"{v}: unavailable: {errors[v]}", file=sys.stderr)
                continue
            runs[v].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r} {v}: {len(texts) / runs[v][-1]['wall_s']:.1f} texts/s", file=sys.stderr)

    base_vecs = np.load(work / "plain.npy")
    base_best = min(x["wall_s"] for x in runs["plain"])
    results = {}
    for v in variants:
        if not runs[v]:
            results[v] = {"what": VARIANTS[v], "error": errors.get(v, "no run")}
            continue
        best = min(runs[v], key=lambda x: x["wall_s"])
        results[v] = {"what": VARIANTS[v], "texts_per_s": len(texts) / best["wall_s"],
                      "texts_per_cpu_s": len(texts) / best["cpu_s"],
                      "rounds_texts_per_s": [len(texts) / x["wall_s"] for x in runs[v]],
                      "embed_speedup": base_best / best["wall_s"], "load_s": best["load_s"],
                      **agreement(base_vecs, np.load(work / f"{v}.npy"), len(texts))}
    shutil.rmtree(work, ignore_errors=True)  # the texts and every variant's vectors: compared above

    print(f"\n{len(texts)} texts, {len(queries)} queries, best of {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs, load avg {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'variant':20s} {'texts/s':>8s} {'speedup':>8s} {'txt/cpu-s':>9s} {'cos mean':>9s} "
          f"{'cos min':>9s} {'top10':>6s}")
    for v, x in results.items():
        if "error" in x:
            print(f"{v:20s} unavailable: {x['error'][:90]}")
            continue
        print(f"{v:20s} {x['texts_per_s']:8.1f} {x['embed_speedup']:7.2f}x {x['texts_per_cpu_s']:9.1f} "
              f"{x['cos_mean']:9.5f} {x['cos_min']:9.5f} {x['top10_overlap']:6.3f}")
    out = {"texts": len(texts), "queries": len(queries), "rounds": args.rounds,
           "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
           "onnx_prepare_s": prepare_s, "variants": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
