"""Dev evaluation on click 8.5.1: gold answers come from click's own code and docs.

Query sets
- exact: a function/method/class's qualified name -> that symbol.
- docstring: a docstring's first sentence -> its function (CodeSearchNet style); the sentence is
  blanked in the indexed copy, so only the rest of the code can find it.
- doc_section: a docs section's heading + first sentence -> the code symbols it references with
  :role: markup (recall counts how many of them the code hits recover).
- bridge: a whole docs section (heading + body, as a maintainer pastes it) -> the answer's
  doc->code bridge; recall and precision of its symbols against the section's :role: references,
  and how many sections the reader refused.
Reports hit@1, recall@10 and MRR@10 for hybrid and each single channel, and latency p50/p95.

Usage: python bench/eval/run.py [--out bench/out/eval.json] [--limit 80]
"""
from __future__ import annotations

import argparse
import ast
import random
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import REPO, fetch_sdist, mtrag_env, percentile, run_mtrag, stop_neo4j, wipe_work, write_json  # noqa: E402

MODES = ("hybrid", "dense", "lexical", "exact")
# Sphinx roles (:func:`x`) and their MyST form ({func}`x`), optionally "title <target>".
ROLE_RE = re.compile(r"(?::(?:py:)?|\{)(?:func|meth|class|attr|exc|obj)(?::|\})`(?:[^`<]*<)?~?([A-Za-z_][\w.]*)>?`")


def first_sentence(doc: str) -> str:
    text = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return m.group(1) if m else text


def collect_code_queries(src: Path, rng: random.Random, limit: int):
    exact, docstring = [], []
    for path in sorted(src.rglob("*.py")):
        module = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                        item._qn = f"{module}.{node.name}.{item.name}"
                node._qn = f"{module}.{node.name}"
        for node in ast.walk(tree):
            qn = getattr(node, "_qn", None)
            if qn is None and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.col_offset == 0:
                qn = f"{module}.{node.name}"
            if qn is None or node.name.startswith("_"):
                continue
            exact.append({"query": qn, "gold": [qn], "file": path})
            doc = ast.get_docstring(node)
            if doc:
                sentence = first_sentence(doc)
                if len(sentence.split()) >= 6:
                    docstring.append({"query": sentence, "gold": [qn], "file": path})
    rng.shuffle(exact)
    rng.shuffle(docstring)
    return exact[:limit], docstring[:limit]


def blank_sentences(src: Path, queries: list[dict]) -> None:
    """Remove each query's sentence from the indexed copy (whitespace-insensitive match)."""
    by_file: dict[Path, list[str]] = {}
    for q in queries:
        by_file.setdefault(q["file"], []).append(q["query"])
    for path, sentences in by_file.items():
        text = path.read_text()
        for sentence in sentences:
            words = [re.escape(w) for w in sentence.split()]
            text, n = re.subn(r"\s+".join(words), "", text, count=1)
            if n == 0:
                raise RuntimeError(f"could not blank {sentence!r} in {path}")
        path.write_text(text)


def collect_doc_queries(docs: Path, limit: int, whole: bool = False) -> list[dict]:
    out = []
    for path in sorted(docs.rglob("*.md")):
        sections = re.split(r"^(#{1,4} .+)$", path.read_text(), flags=re.M)
        for heading, body in zip(sections[1::2], sections[2::2]):
            refs = sorted({r if r.startswith("click.") else f"click.{r}" for r in ROLE_RE.findall(body)})
            prose = [l for l in body.split("\n\n") if l.strip() and not l.lstrip().startswith(("```", ":", ".."))]
            if refs and prose:
                sentence = first_sentence(prose[0])[:200]
                query = f"{heading}\n{body.strip()}" if whole else f"{heading.lstrip('# ').strip()}: {sentence}"
                out.append({"query": query, "gold": refs})
    return out[:limit]


def gold_match(symbol: str, gold: list[str]) -> bool:
    # Docs name the public re-export (click.echo); code defines click.utils.echo.
    return any(symbol == g or symbol.split(".")[-1] == g.split(".")[-1] and symbol.startswith("click.") for g in gold)


def score(reader, qset: list[dict], mode: str, kind: str | None, recall_all: bool) -> dict:
    hit1 = rec = mrr = 0.0
    lat = []
    for q in qset:
        t0 = time.perf_counter()
        result = reader.query(q["query"], k=10, kind=kind, mode=mode)
        lat.append((time.perf_counter() - t0) * 1000)
        symbols = [h["symbol"] for h in result["hits"] if h["source_kind"] == "code"][:10]
        ranks = [i for i, s in enumerate(symbols) if gold_match(s, q["gold"])]
        hit1 += bool(ranks and ranks[0] == 0)
        mrr += 1 / (ranks[0] + 1) if ranks else 0
        if recall_all:
            rec += sum(any(gold_match(s, [g]) for s in symbols) for g in q["gold"]) / len(q["gold"])
        else:
            rec += bool(ranks)
    n = max(1, len(qset))
    return {"n": len(qset), "hit@1": round(hit1 / n, 3), "recall@10": round(rec / n, 3), "mrr@10": round(mrr / n, 3),
            "p50_ms": round(percentile(lat, 50), 1), "p95_ms": round(percentile(lat, 95), 1)}


def score_bridge(reader, qset: list[dict]) -> dict:
    """Recall and precision of the bridge's symbols against each section's references."""
    from mtrag_resources.serving.reader import QueryError
    rec = prec = 0.0
    refused = answered = entries = 0
    lat = []
    for q in qset:
        t0 = time.perf_counter()
        try:
            result = reader.query(q["query"], k=10)
        except QueryError:
            refused += 1
            continue
        lat.append((time.perf_counter() - t0) * 1000)
        answered += 1
        symbols = list(dict.fromkeys(b["symbol"] for b in result["bridge"] if b.get("symbol")))
        entries += len(symbols)
        rec += sum(any(gold_match(s, [g]) for s in symbols) for g in q["gold"]) / len(q["gold"])
        prec += (sum(gold_match(s, q["gold"]) for s in symbols) / len(symbols)) if symbols else 0.0
    n = max(1, answered)
    return {"n": len(qset), "refused": refused, "recall": round(rec / n, 3), "precision": round(prec / n, 3),
            "symbols_per_answer": round(entries / n, 1),
            "p50_ms": round(percentile(lat, 50), 1) if lat else None, "p95_ms": round(percentile(lat, 95), 1) if lat else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "bench/out/eval.json"))
    ap.add_argument("--work", default=str(REPO / "bench/out/eval-work"))
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    work = Path(args.work)
    wipe_work(work)
    work.mkdir(parents=True)
    sdist = fetch_sdist("click==8.5.1", work / "sdists")
    corpus = work / "click"
    shutil.copytree(sdist / "src", corpus / "src")
    shutil.copytree(sdist / "docs", corpus / "docs")
    rng = random.Random(args.seed)
    exact, docstring = collect_code_queries(corpus / "src", rng, args.limit)
    blank_sentences(corpus / "src", docstring)
    doc_sections = collect_doc_queries(corpus / "docs", args.limit)
    whole_sections = collect_doc_queries(corpus / "docs", args.limit, whole=True)
    sources = work / "sources.yaml"
    sources.write_text(f"sources:\n  - {{id: click, kind: code, path: {corpus}, include: ['src/**/*.py']}}\n"
                       f"  - {{id: click-docs, kind: docs, path: {corpus}, include: ['docs/**/*.md']}}\n")
    env = mtrag_env(work / "home", sources)
    build_s, _, _ = run_mtrag(["build"], env)
    import os
    os.environ.update(env)
    from mtrag_resources.serving.reader import IndexReader
    reader = IndexReader(home=str(work / "home"), log_proposals=False)
    reader.query("warm up", k=3)
    results = {}
    for name, qset, kind, recall_all in (("exact", exact, "code", False), ("docstring", docstring, "code", False),
                                         ("doc_section", doc_sections, "code", True)):
        results[name] = {mode: score(reader, qset, mode, kind, recall_all) for mode in MODES}
    results["bridge"] = {"hybrid": score_bridge(reader, whole_sections)}
    reader.close()
    stop_neo4j(env)  # the build started the work home's server
    b = results["bridge"]["hybrid"]
    print(f"bridge over {b['n']} whole sections: recall {b['recall']}, precision {b['precision']}, "
          f"{b['refused']} refused, {b['symbols_per_answer']} symbols per answer")
    table = ["| query set | mode | n | hit@1 | recall@10 | MRR@10 | p50 ms | p95 ms |", "|---|---|---|---|---|---|---|---|"]
    for name, by_mode in results.items():
        if name == "bridge":
            continue
        for mode, r in by_mode.items():
            table.append(f"| {name} | {mode} | {r['n']} | {r['hit@1']} | {r['recall@10']} | {r['mrr@10']} | "
                         f"{r['p50_ms']} | {r['p95_ms']} |")
    print("\n".join(table))
    write_json(args.out, {"build_s": round(build_s, 1), "results": results, "table": table})


if __name__ == "__main__":
    main()
