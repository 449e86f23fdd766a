"""Write the texts that calibrate the int8 embedder's activation ranges.

The int8 backend quantizes activations with fixed ranges measured once on these texts (so one
text's vector never depends on the batch it is embedded with). They are frozen in the package, so
every machine derives the same ranges: functions and their docstring first lines from mtrag's own
code (code chunks and short queries), sections of its docs (English prose, Markdown), and
paragraphs of the Chinese design articles in ../shared/seeds (CJK documents).

    .venv/bin/python scripts/calibration_texts.py   # rewrites mtrag_resources/embedding/data/int8_calibration.json
"""
from __future__ import annotations

import ast
import json
import random
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "mtrag_resources" / "data" / "int8_calibration.json"
MAX_CHARS = 1500  # ~256 tokens of code: the model truncates there anyway


def code_and_queries() -> tuple[list[str], list[str]]:
    code, queries = [], []
    for f in sorted((REPO / "mtrag_resources").rglob("*.py")):
        src = f.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                seg = ast.get_source_segment(src, node) or ""
                if len(seg) > 200:
                    code.append(seg[:MAX_CHARS])
                doc = ast.get_docstring(node)
                if doc and len(doc.split("\n")[0]) > 20:
                    queries.append(doc.split("\n")[0])
    return code, queries


def doc_sections() -> list[str]:
    out = []
    for f in [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for part in re.split(r"\n(?=#{1,3} )", f.read_text(encoding="utf-8")):
            part = part.strip()
            out += [part[i:i + MAX_CHARS] for i in range(0, len(part), MAX_CHARS) if len(part[i:i + MAX_CHARS]) > 200]
    return out


def cjk_paragraphs() -> list[str]:
    out = []
    for f in sorted((REPO.parent / "shared" / "seeds").glob("*.txt")):
        text = f.read_text(encoding="utf-8")
        out += [text[i:i + 400] for i in range(0, len(text), 400) if len(text[i:i + 400]) > 100]
    return out


def main() -> None:
    rng = random.Random(0)
    code, queries = code_and_queries()
    picks = {"code": (code, 150), "query": (queries, 50), "doc": (doc_sections(), 60), "cjk": (cjk_paragraphs(), 40)}
    texts = []
    for kind, (pool, n) in picks.items():
        chosen = rng.sample(pool, min(n, len(pool)))
        texts += [{"kind": kind, "text": t} for t in chosen]
        print(f"{kind}: {len(chosen)} of {len(pool)}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(texts, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KiB, {len(texts)} texts)")


if __name__ == "__main__":
    main()
