"""Dev evaluation, cross-language set: Chinese questions about English code and docs.

Corpus: two packages by different authors, from their pinned PyPI sdists (`fetch_sdist`):
click 8.5.1 (code `src/**/*.py`, docs `docs/**/*.md`) and pluggy 1.7.0 (code `src/**/*.py`, docs
`docs/**/*.rst`), copied into the work folder and built by `mtrag build` as ONE home of four sources
(`click`, `click-docs`, `pluggy`, `pluggy-docs`).

Questions: bench/eval/xling_questions.yaml, ~2/3 click, ~1/3 pluggy. Each has a Chinese form `zh`
and the same question as an English developer would ask it, `en`; both are asked, so the ratio
recall@10(zh) / recall@10(en) says how much of what English finds Chinese finds. Kinds:
- pure:  the zh text holds no ASCII letter at all;
- mixed: Chinese around an identifier kept as a user types it (`Group 怎么添加子命令`).
Gold: `gold`, qualified symbols of the package named by their defining module
(`click.termui.prompt`, `pluggy._manager.PluginManager.register`), and optionally `gold_docs`,
doc files relative to the package root (`docs/prompts.md`), `#Heading` narrowing one to a section.

Checks first, always (exit 1 naming the question; `--check`: only these): every gold symbol exists
in the unpacked sdist (resolved with `ast`: module path of the file under src/, then classes,
functions, methods, also inside top-level `if`/`try` blocks; a name re-exported by a package
`__init__` must be given by its defining module); every gold_docs file (and section heading)
exists; a `pure` zh has no ASCII letter, a `mixed` one has at least one; ids unique; at least 60
questions; package, kind, zh, en and gold present.

Scoring: every question's zh and en through `IndexReader(home).query(text, k=10, mode=m)` for m in
hybrid, dense, lexical, without a kind filter (a user asks without one). A hit counts when
- it is a code hit of the question's package whose `symbol` equals a gold symbol, or ends with
  "." + the gold's last two dotted parts for a gold defined in a class (a method) or "." + its
  last part for a top-level gold (a module's function or class: re-exports and shims match); or
- it is a docs hit of the package's docs source whose file_path ends with a gold_docs path (and,
  for `path#Heading`, whose lines overlap that section's lines).
Reported per language (zh, en), per mode, per kind (pure, mixed, all) and per package (click,
pluggy): hit@1, recall@10, MRR@10, code_recall@10 (code hits only) and recall@10 zh/en; hybrid
query latency p50/p95 per language; for each language and mode the answers' `confidence` (low vs
normal/high) split by whether the top hit is right. Per question: the rank of the first right hit
for each language and mode, and the top 3 of each miss. Questions whose en form misses in every
mode are listed (`en_fails_everywhere`): kept, but they say more about the gold or the index than
about the language.

The home's Neo4j is stopped at the end (`stop_neo4j(env)`, as run.py does), also after an error,
and also for a `--home` (start it again with `mtrag neo4j start` where needed).

Usage: python bench/eval/xling.py [--out bench/out/eval-xling.json] [--work bench/out/eval-xling-work]
                                  [--home HOME] [--check]
  --home HOME  reuse a home built earlier by this script (bench/out/eval-xling-work/home)
  --check      only verify the question set (downloads the two sdists into --sdists if missing)
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import REPO, fetch_sdist, mtrag_env, percentile, run_mtrag, stop_neo4j, wipe_work, write_json  # noqa: E402

QUESTIONS = Path(__file__).with_name("xling_questions.yaml")
PACKAGES = {  # package -> (requirement, code include, docs include)
    "click": ("click==8.5.1", "src/**/*.py", "docs/**/*.md"),
    "pluggy": ("pluggy==1.7.0", "src/**/*.py", "docs/**/*.rst"),
}
KINDS = ("pure", "mixed")
MODES = ("hybrid", "dense", "lexical")
LANGS = ("zh", "en")
K = 10
MIN_QUESTIONS = 60
ASCII_LETTER = re.compile(r"[A-Za-z]")


# ---------------------------------------------------------------- the packages' symbols and sections

def package_symbols(src: Path) -> dict[str, bool]:
    """Qualified name -> defined in a class (a method or nested class), for every class, function
    and method of the .py files under `src` (module path from the file's path under src/)."""
    out: dict[str, bool] = {}

    def walk(body: list, prefix: str, in_class: bool) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qn = f"{prefix}.{node.name}"
                out.setdefault(qn, in_class)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, qn, True)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):  # `if TYPE_CHECKING:`, `try: import`
                for block in (getattr(node, "body", []), getattr(node, "orelse", []), getattr(node, "finalbody", []),
                              *[h.body for h in getattr(node, "handlers", [])]):
                    walk(block, prefix, in_class)

    for path in sorted(src.rglob("*.py")):
        module = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        walk(ast.parse(path.read_text(encoding="utf-8")).body, module, False)
    return out


def heading_key(text: str) -> str:
    return " ".join(text.replace("`", "").split()).lower()


def doc_sections(path: Path) -> list[tuple[str, int, int, int]]:
    """(heading key, level, first line, last line) of each section of a .md or .rst file, 1-based
    lines; a section runs from its heading to the line before the next heading of the same or a
    higher level (a smaller level number)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    heads: list[tuple[str, int, int]] = []  # (key, level, line)
    if path.suffix == ".md":
        fence = None
        for i, line in enumerate(lines):
            m = re.match(r"^(```+|~~~+)", line.lstrip())
            if m:
                mark = m.group(1)[0] * 3
                fence = None if fence == mark else (fence or mark)
                continue
            h = re.match(r"^(#{1,6})\s+(.+?)\s*#*\s*$", line)
            if fence is None and h:
                heads.append((heading_key(h.group(2)), len(h.group(1)), i + 1))
    else:  # reStructuredText: a title line, then an underline of one punctuation character
        order: list[str] = []
        for i in range(len(lines) - 1):
            title, under = lines[i], lines[i + 1]
            if (title.strip() and not title[0].isspace() and re.fullmatch(r"([=\-^~*#+\"'`:.])\1{2,}", under)
                    and len(under) >= len(title.rstrip()) and not re.fullmatch(r"([=\-^~*#+\"'`:.])\1+", title)):
                over = lines[i - 1] if i else ""
                key = ("o" if over == under else "") + under[0]
                if key not in order:
                    order.append(key)
                heads.append((heading_key(title), order.index(key) + 1, i + 1))
    out = []
    for j, (key, level, start) in enumerate(heads):
        end = len(lines)
        for key2, level2, start2 in heads[j + 1:]:
            if level2 <= level:
                end = start2 - 1
                break
        out.append((key, level, start, end))
    return out


# ---------------------------------------------------------------- the question set

def load_questions(roots: dict[str, Path]) -> tuple[list[dict], dict[str, dict[str, bool]], dict]:
    """The checked questions, each package's symbols, and the gold sections' line ranges
    ((package, 'path#Heading') -> (first, last))."""
    import yaml
    qs = yaml.safe_load(QUESTIONS.read_text(encoding="utf-8"))["questions"]
    symbols = {p: package_symbols(root / "src") for p, root in roots.items()}
    sections: dict[tuple[str, str], tuple[int, int]] = {}
    errors = []
    seen = set()
    for q in qs:
        qid = q.get("id", "?")
        missing = [f for f in ("id", "package", "kind", "zh", "en", "gold") if not q.get(f)]
        if missing:
            errors.append(f"{qid}: missing {missing}")
            continue
        if qid in seen:
            errors.append(f"{qid}: duplicate id")
        seen.add(qid)
        if q["package"] not in PACKAGES:
            errors.append(f"{qid}: package {q['package']!r} not in {tuple(PACKAGES)}")
            continue
        if q["kind"] not in KINDS:
            errors.append(f"{qid}: kind {q['kind']!r} not in {KINDS}")
        if q["kind"] == "pure" and ASCII_LETTER.search(q["zh"]):
            errors.append(f"{qid}: a pure question has ASCII letters: {q['zh']!r}")
        if q["kind"] == "mixed" and not ASCII_LETTER.search(q["zh"]):
            errors.append(f"{qid}: a mixed question has no ASCII letter: {q['zh']!r}")
        if not isinstance(q["gold"], list) or not isinstance(q.get("gold_docs", []), list):
            errors.append(f"{qid}: gold and gold_docs must be lists")
            continue
        syms = symbols[q["package"]]
        for g in q["gold"]:
            if g not in syms:
                errors.append(f"{qid}: gold symbol {g!r} is not defined in {q['package']}'s sdist")
        for d in q.get("gold_docs", []):
            path, _, heading = d.partition("#")
            f = roots[q["package"]] / path
            if not f.is_file():
                errors.append(f"{qid}: gold_docs file {path!r} is not in {q['package']}'s sdist")
                continue
            if heading:
                found = [s for s in doc_sections(f) if s[0] == heading_key(heading)]
                if len(found) != 1:
                    errors.append(f"{qid}: gold_docs section {heading!r} occurs {len(found)} times in {path}")
                    continue
                sections[(q["package"], d)] = found[0][2:]
    if len(qs) < MIN_QUESTIONS:
        errors.append(f"only {len(qs)} questions (need at least {MIN_QUESTIONS})")
    if errors:
        print("question set check failed:\n  " + "\n  ".join(errors), file=sys.stderr)
        sys.exit(1)
    return qs, symbols, sections


# ---------------------------------------------------------------- matching and scoring

def code_match(symbol: str, q: dict, symbols: dict[str, dict[str, bool]]) -> bool:
    if not symbol or not symbol.startswith(q["package"] + "."):
        return False
    for g in q["gold"]:
        parts = g.split(".")
        tail = ".".join(parts[-2:]) if symbols[q["package"]][g] else parts[-1]
        if symbol == g or symbol.endswith("." + tail):
            return True
    return False


def docs_match(hit: dict, q: dict, sections: dict) -> bool:
    if hit.get("source_id") != f"{q['package']}-docs":
        return False
    for d in q.get("gold_docs", []):
        path = d.partition("#")[0]
        if not hit["file_path"].endswith(path):
            continue
        rng = sections.get((q["package"], d))
        if rng is None:
            return True
        start, end = hit.get("start_line") or 0, hit.get("end_line") or 0
        if start <= rng[1] and end >= rng[0]:
            return True
    return False


def judge(hits: list[dict], q: dict, symbols: dict, sections: dict) -> tuple[int | None, int | None]:
    """(0-based rank of the first right hit, of the first right code hit) within the top K."""
    first = first_code = None
    for i, h in enumerate(hits[:K]):
        code = h["source_kind"] == "code" and code_match(h.get("symbol") or "", q, symbols)
        if code and first_code is None:
            first_code = i
        if first is None and (code or (h["source_kind"] == "docs" and docs_match(h, q, sections))):
            first = i
    return first, first_code


def score(rows: list[dict]) -> dict:
    """rows: {"rank", "code_rank"} per question."""
    n = max(1, len(rows))
    ranks = [r["rank"] for r in rows]
    return {"n": len(rows), "hit@1": round(sum(r == 0 for r in ranks) / n, 3),
            "recall@10": round(sum(r is not None for r in ranks) / n, 3),
            "mrr@10": round(sum(1 / (r + 1) for r in ranks if r is not None) / n, 3),
            "code_recall@10": round(sum(r["code_rank"] is not None for r in rows) / n, 3)}


def brief(hits: list[dict], n: int = 3) -> list[str]:
    out = []
    for h in hits[:n]:
        where = h.get("symbol") if h["source_kind"] == "code" else f"{h['file_path']}:{h.get('start_line')} {h.get('title') or ''}"
        out.append(f"{h['source_id']} {where}"[:110])
    return out


def groups(q: dict) -> list[str]:
    return ["all", q["kind"], q["package"]]


GROUPS = ("all", *KINDS, *PACKAGES)


# ---------------------------------------------------------------- main

def build_home(work: Path, roots: dict[str, Path]) -> tuple[Path, dict, dict]:
    wipe_work(work)
    corpus = work / "corpus"
    lines = ["sources:"]
    for pkg, root in roots.items():
        _, code_glob, docs_glob = PACKAGES[pkg]
        dest = corpus / pkg
        shutil.copytree(root / "src", dest / "src")
        shutil.copytree(root / "docs", dest / "docs")
        lines.append(f"  - {{id: {pkg}, kind: code, path: {dest}, include: ['{code_glob}']}}")
        lines.append(f"  - {{id: {pkg}-docs, kind: docs, path: {dest}, include: ['{docs_glob}']}}")
    sources = work / "sources.yaml"
    sources.write_text("\n".join(lines) + "\n")
    home = work / "home"
    env = mtrag_env(home, sources)
    return home, env, {"sources": str(sources)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "bench/out/eval-xling.json"))
    ap.add_argument("--work", default=str(REPO / "bench/out/eval-xling-work"))
    ap.add_argument("--sdists", default=str(REPO / "bench/out/xling-sdists"),
                    help="where the two sdists are downloaded and unpacked once (kept across runs)")
    ap.add_argument("--home", help="reuse this built home instead of building one")
    ap.add_argument("--check", action="store_true", help="only verify the question set")
    args = ap.parse_args()
    roots = {pkg: fetch_sdist(req, Path(args.sdists)) for pkg, (req, _, _) in PACKAGES.items()}
    qs, symbols, sections = load_questions(roots)
    counts = {g: sum(g in groups(q) for q in qs) for g in GROUPS}
    print(f"{len(qs)} questions ok: {counts}")
    if args.check:
        return

    build = None
    if args.home:
        home = Path(args.home).resolve()
        env = mtrag_env(home, home.parent / "sources.yaml")
    else:
        home, env, _ = build_home(Path(args.work), roots)
    try:
        if not args.home:
            build_s, _, peak_mb = run_mtrag(["build"], env)
            build = {"build_s": round(build_s, 1), "peak_rss_mb": peak_mb}
            print(f"mtrag build of the xling home (click + pluggy, code + docs): {build_s:.1f} s, peak RSS {peak_mb} MB")
        results = evaluate(home, env, qs, symbols, sections)
    finally:
        stop_neo4j(env)  # the server the build started (or the reused home's)
    report(args, build, home, qs, counts, results)


def evaluate(home: Path, env: dict, qs: list[dict], symbols: dict, sections: dict) -> dict:
    os.environ.update(env)
    from mtrag_resources.serving.reader import IndexReader, QueryError
    reader = IndexReader(home=str(home), log_proposals=False)
    try:
        for mode in MODES:  # load the embedders and open the stores outside the timed queries
            for text in ("warm up", "预热查询"):
                reader.query(text, k=3, mode=mode)
        rows: dict[str, dict[str, list[dict]]] = {lang: {m: [] for m in MODES} for lang in LANGS}
        lat: dict[str, dict[str, list[float]]] = {lang: {m: [] for m in MODES} for lang in LANGS}
        refused: dict[str, dict[str, list[str]]] = {lang: {m: [] for m in MODES} for lang in LANGS}
        for mode in MODES:
            for q in qs:
                for lang in LANGS:  # zh and en alternate: both see the same machine load
                    t0 = time.perf_counter()
                    try:
                        answer = reader.query(q[lang], k=K, mode=mode)
                        hits = [dict(h) for h in answer["hits"]]
                        confidence = answer["confidence"]
                    except QueryError as exc:
                        hits, confidence = [], f"refused: {exc}"
                        refused[lang][mode].append(q["id"])
                    lat[lang][mode].append((time.perf_counter() - t0) * 1000)
                    rank, code_rank = judge(hits, q, symbols, sections)
                    rows[lang][mode].append({"id": q["id"], "rank": rank, "code_rank": code_rank,
                                             "confidence": confidence, "top3": brief(hits) if rank is None else None,
                                             "top1": brief(hits, 1)})
    finally:
        reader.close()
    return {"rows": rows, "lat": lat, "refused": refused}


def report(args, build, home: Path, qs: list[dict], counts: dict, results: dict) -> None:
    rows, lat, refused = results["rows"], results["lat"], results["refused"]
    scores: dict = {}
    for lang in LANGS:
        for mode in MODES:
            for g in GROUPS:
                sel = [r for r, q in zip(rows[lang][mode], qs) if g in groups(q)]
                scores.setdefault(lang, {}).setdefault(mode, {})[g] = score(sel)
    ratio = {mode: {g: (round(scores["zh"][mode][g]["recall@10"] / scores["en"][mode][g]["recall@10"], 3)
                        if scores["en"][mode][g]["recall@10"] else None) for g in GROUPS} for mode in MODES}
    latency = {lang: {mode: {"p50_ms": round(percentile(lat[lang][mode], 50), 1),
                             "p95_ms": round(percentile(lat[lang][mode], 95), 1)} for mode in MODES} for lang in LANGS}
    confidence = {}
    for lang in LANGS:
        for mode in MODES:
            c = {"top1_right": {"low": 0, "normal/high": 0}, "top1_wrong": {"low": 0, "normal/high": 0}}
            for r in rows[lang][mode]:
                side = "top1_right" if r["rank"] == 0 else "top1_wrong"
                c[side]["low" if r["confidence"] == "low" else "normal/high"] += 1
            confidence.setdefault(lang, {})[mode] = c
    per_q = {q["id"]: {"package": q["package"], "kind": q["kind"], "zh": q["zh"], "en": q["en"],
                       **{f"{lang}-{mode}": rows[lang][mode][i]["rank"] for lang in LANGS for mode in MODES},
                       **{f"{lang}-{mode}-code": rows[lang][mode][i]["code_rank"] for lang in LANGS for mode in MODES},
                       "zh-hybrid-confidence": rows["zh"]["hybrid"][i]["confidence"]}
             for i, q in enumerate(qs)}
    misses = {f"{lang}-{mode}": {r["id"]: r["top3"] for r in rows[lang][mode] if r["rank"] is None}
              for lang in LANGS for mode in MODES}
    en_fail = [q["id"] for i, q in enumerate(qs) if all(rows["en"][m][i]["rank"] is None for m in MODES)]
    zh_fail = [q["id"] for i, q in enumerate(qs) if all(rows["zh"][m][i]["rank"] is None for m in MODES)]

    table = ["| lang | mode | group | n | hit@1 | recall@10 | MRR@10 | code R@10 | R@10 zh/en |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode in MODES:
        for g in GROUPS:
            for lang in LANGS:
                s = scores[lang][mode][g]
                table.append(f"| {lang} | {mode} | {g} | {s['n']} | {s['hit@1']} | {s['recall@10']} | {s['mrr@10']} | "
                             f"{s['code_recall@10']} | {ratio[mode][g] if lang == 'zh' else ''} |")
    lat_line = "hybrid latency: " + "; ".join(f"{lang} p50 {latency[lang]['hybrid']['p50_ms']} ms, "
                                                f"p95 {latency[lang]['hybrid']['p95_ms']} ms" for lang in LANGS)
    c = confidence["zh"]["hybrid"]
    conf_line = (f"zh hybrid confidence: top-1 right: {c['top1_right']['low']} low, {c['top1_right']['normal/high']} "
                 f"normal/high; top-1 wrong: {c['top1_wrong']['low']} low, {c['top1_wrong']['normal/high']} normal/high")
    print("\n".join(table))
    print(lat_line)
    print(conf_line)
    print(f"en misses in every mode ({len(en_fail)}): {en_fail}")
    print(f"zh misses in every mode ({len(zh_fail)}): {zh_fail}")
    write_json(args.out, {"build": build, "home": str(home), "questions": len(qs), "counts": counts,
                          "packages": {p: req for p, (req, _, _) in PACKAGES.items()},
                          "scores": scores, "recall_ratio_zh_en": ratio, "latency": latency,
                          "confidence": confidence, "refused": refused, "en_fails_everywhere": en_fail,
                          "zh_fails_everywhere": zh_fail, "per_question": per_q, "misses_top3": misses,
                          "table": table, "latency_line": lat_line, "confidence_line": conf_line})


if __name__ == "__main__":
    main()
