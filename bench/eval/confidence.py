"""Can an answer's own signals say whether its first hit is right? A learned confidence measured
against the reader's rule.

Questions with a known answer, asked through the reader as a user asks them, each answer's
features recorded as the reader computes them (its honesty step is wrapped) with whether its first
hit is right:
- per dev package (bench/eval/run.py's homes, built here): the docstring sentences (blanked in the
  indexed copy) and the doc sections, in mode hybrid with kind code, as run.py scores them (right:
  a gold symbol, run.py's gold_match);
- the cross-lingual set (bench/eval/xling.py's home, click + pluggy): every question in Chinese and
  in English, hybrid, no kind (right: xling.py's judge);
- off-topic questions (calibrate.py's) on every home, with and without kind code: never right.
Identifier questions are left out: the exact lookup decides theirs.

Then, per package (the cross-lingual questions count as their package's, off-topic ones as the
home's), a logistic model (scikit-learn, standardised features) trained on the other packages
says `low` or `normal` for that package's answers, at the threshold that labels the pooled
held-out answers best; the figures are the share of wrong first hits said `low` and of right ones
said `normal`, the AUC, and the same for the reader's rule (serving/query_flow.py: low when no
top-3 hit reaches a calibrated cosine). It measures whether what an answer shows can tell a right
first hit from a wrong one; bench/README.md has what it found (the reader keeps its rule).

Usage: python bench/eval/confidence.py [--package click ...] [--dataset bench/out/confidence-data.json]
       [--reuse] [--out bench/out/confidence.json]
  --reuse   train from the recorded --dataset without building or asking
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.common import REPO, built_reader, fetch_sdist, mtrag_env, wipe_work, write_json  # noqa: E402
from bench.eval import xling  # noqa: E402
from bench.eval.calibrate import OFF_TOPIC  # noqa: E402
from bench.eval.run import PACKAGES, gold_match, prepare  # noqa: E402
from mtrag_resources.core.scripts import is_cjk_query  # noqa: E402
from mtrag_resources.serving import query_flow  # noqa: E402
from mtrag_resources.serving.query_text import is_identifier_query  # noqa: E402
from mtrag_resources.serving.ranker import words  # noqa: E402

DEFAULT = ("click", "attrs", "pluggy", "alembic")
SETS = ("docstring", "doc_section")
OLD_RULE = query_flow.MIN_TOP_COSINE  # the reader's rule
CHANNELS = ("dense", "fts", "fts_en", "exact", "dense_ml")
ABSENT_RANK = 100
FEATURES = (
    "score_top", "score_margin", "cosine_top", "cosine_max3", "ml_cosine_top", "ml_cosine_max3",
    "channels_top", *(f"log_rank_{c}" for c in CHANNELS), "name_cover", "name_overlap", "text_cover",
    "log_query_words", "cjk", "exact_found", "top_is_code",
)


def _share(part: set[str], whole: set[str]) -> float:
    return len(part & whole) / len(whole) if whole else 0.0


def answer_features(text: str, hits: Sequence[Mapping], ml_cosines: Mapping[str, float],
                    exact_found: bool) -> list[float] | None:
    """The answer's feature vector in FEATURES order; None for an answer without hits."""
    if not hits:
        return None
    top, second = hits[0], (hits[1] if len(hits) > 1 else None)
    s0 = float(top.get("score") or 0.0)
    s1 = float(second.get("score") or 0.0) if second else 0.0
    cos = [h.get("cosine") for h in hits[:3]]
    ml = [ml_cosines.get(h["chunk_id"]) for h in hits[:3]]
    channels = top.get("channels") or {}
    query = set(words(text))
    symbol = str(top.get("symbol") or "")
    name = set(words(symbol.replace("::", ".").split(".")[-1] if symbol else str(top.get("title") or "")))
    body = set(words(str(top.get("text") or "")[:4000]))
    return [
        s0, (s0 - s1) / s0 if s0 else 0.0,
        cos[0] if cos[0] is not None else -1.0, max((c for c in cos if c is not None), default=-1.0),
        ml[0] if ml[0] is not None else -1.0, max((c for c in ml if c is not None), default=-1.0),
        float(len(channels)),
        *(math.log1p(channels[c]["rank"] if c in channels else ABSENT_RANK) for c in CHANNELS),
        _share(query, name), _share(name, query), _share(query, body),
        math.log1p(len(query)), 1.0 if is_cjk_query(text) else 0.0, 1.0 if exact_found else 0.0,
        1.0 if top.get("source_kind") == "code" else 0.0,
    ]


class Recording:
    """Wraps the reader's honesty step (query_flow._honesty): keeps the last answer's features and
    what the reader's rule said."""

    def __init__(self) -> None:
        self.last = None
        self.inner = None

    def install(self) -> None:
        if self.inner is None:
            self.inner = query_flow._honesty
            query_flow._honesty = self

    def __call__(self, text, hits, exact_found, ml_cosines):
        exact, said = self.inner(text, hits, exact_found, ml_cosines)
        self.last = {"features": answer_features(text, hits, ml_cosines, bool(exact_found)), "old_low": said == "low"}
        return exact, said


RECORDING = Recording()


def ask(reader, text: str, kind: str | None) -> tuple[dict, dict | None]:
    """The reader's answer and what RECORDING kept of it (None for an answer without a hit)."""
    RECORDING.install()
    RECORDING.last = None
    result = reader.query(text, k=10, kind=kind)
    return result, RECORDING.last


def off_topic(reader, group: str) -> list[dict]:
    out = []
    for q in OFF_TOPIC:
        for kind in (None, "code"):
            _, rec = ask(reader, q, kind)
            if rec and rec["features"]:
                out.append({"group": group, "set": "off_topic", "query": q, "right": False, **rec})
    return out


def record_package(name: str, work: Path, args) -> list[dict]:
    """A package's answers; its home is built unless an earlier run built it (the questions are
    drawn again from a fresh copy with the same seed: the same questions the home was blanked for)."""
    home = work / name / "home"
    if (home / "08-manifest" / "CURRENT").exists():
        with tempfile.TemporaryDirectory() as scratch:
            prepared = prepare(name, Path(scratch), args)
        prepared.update(env=mtrag_env(home, work / name / "sources.yaml"), home=home)
    else:
        wipe_work(work / name)
        prepared = prepare(name, work, args)
    env, imports = prepared["env"], PACKAGES[name]["imports"]
    out = []
    with built_reader(prepared["home"], env) as reader:
        for set_name in SETS:
            for q in prepared["sets"].get(set_name, []):
                if is_identifier_query(q["query"]):
                    continue
                result, rec = ask(reader, q["query"], "code")
                if not rec or not rec["features"]:
                    continue
                hits = result["hits"]  # each item access of a result builds its list anew
                right = bool(hits and hits[0]["source_kind"] == "code"
                             and gold_match(hits[0].get("symbol") or "", q["gold"], imports))
                out.append({"group": name, "set": set_name, "query": q["query"], "right": right, **rec})
        out += off_topic(reader, name)
    print(f"[confidence] {name}: {len(out)} answers recorded", flush=True)
    return out


def record_xling(work: Path, sdists: Path) -> list[dict]:
    roots = {pkg: fetch_sdist(req, sdists) for pkg, (req, _, _) in xling.PACKAGES.items()}
    qs, symbols, sections = xling.load_questions(roots)
    if (work / "home" / "08-manifest" / "CURRENT").exists():  # xling.py's home: built again only where needed
        home, env = work / "home", mtrag_env(work / "home", work / "sources.yaml")
    else:
        home, env, _ = xling.build_home(work, roots)
    out = []
    with built_reader(home, env) as reader:
        for q in qs:
            for lang in ("zh", "en"):
                if is_identifier_query(q[lang]):  # the exact lookup decides those
                    continue
                result, rec = ask(reader, q[lang], None)
                if not rec or not rec["features"]:
                    continue
                first, _ = xling.judge(result["hits"], q, symbols, sections)
                out.append({"group": q["package"], "set": f"xling_{lang}", "query": q[lang],
                            "right": first == 0, **rec})
        out += off_topic(reader, "xling")
    print(f"[confidence] xling: {len(out)} answers recorded", flush=True)
    return out


def fit(rows: list[dict]):
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    x = np.array([r["features"] for r in rows], dtype=float)
    y = np.array([int(r["right"]) for r in rows])
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=1.0, max_iter=2000, class_weight="balanced").fit(scaler.transform(x), y)
    return scaler, model


def probabilities(scaler, model, rows: list[dict]) -> list[float]:
    import numpy as np
    return list(model.predict_proba(scaler.transform(np.array([r["features"] for r in rows], dtype=float)))[:, 1])


def figures(rows: list[dict], low: list[bool], p: list[float] | None = None) -> dict:
    wrong = [lo for r, lo in zip(rows, low) if not r["right"]]
    right = [not lo for r, lo in zip(rows, low) if r["right"]]
    out = {"n": len(rows), "right": len(right), "wrong_said_low": round(float(sum(wrong)) / len(wrong), 3) if wrong else None,
           "right_said_normal": round(sum(right) / len(right), 3) if right else None,
           "labelled_right": round(float(sum(wrong) + sum(right)) / len(rows), 3) if rows else None}
    if p is not None and wrong and right:
        from sklearn.metrics import roc_auc_score
        out["auc"] = round(float(roc_auc_score([int(r["right"]) for r in rows], p)), 3)
    return out


def package_of(row: dict) -> str:
    return row["group"] if row["group"] != "xling" else "xling-off-topic"


def evaluate(rows: list[dict]) -> tuple[dict, float]:
    """Leave-one-package-out figures per package and set, old rule against the model, and the
    threshold that labels the pooled held-out answers best."""
    groups = sorted({package_of(r) for r in rows})
    held: list[tuple[dict, float]] = []
    for g in groups:
        train = [r for r in rows if package_of(r) != g]
        test = [r for r in rows if package_of(r) == g]
        scaler, model = fit(train)
        held += list(zip(test, probabilities(scaler, model, test)))
    candidates = [t / 100 for t in range(5, 96)]
    threshold = max(candidates, key=lambda t: sum((p >= t) == r["right"] for r, p in held))
    report: dict = {}
    keys = sorted({(package_of(r), r["set"]) for r, _ in held}) + [("all", s) for s in sorted({r["set"] for r in rows})] \
        + [("all", "all")]
    for g, s in keys:
        part = [(r, p) for r, p in held if (g == "all" or package_of(r) == g) and (s == "all" or r["set"] == s)]
        if not part:
            continue
        rs, ps = [r for r, _ in part], [p for _, p in part]
        report[f"{g}/{s}"] = {"model": figures(rs, [p < threshold for p in ps], ps),
                              "old_rule": figures(rs, [r["old_low"] for r in rs])}
    return report, threshold


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", action="append", choices=sorted(PACKAGES))
    ap.add_argument("--work", default=str(REPO / "bench/out/eval-work"))
    ap.add_argument("--xling-work", default=str(REPO / "bench/out/eval-xling-work"))
    ap.add_argument("--sdists", default=str(REPO / "bench/out/xling-sdists"))
    ap.add_argument("--dataset", default=str(REPO / "bench/out/confidence-data.json"))
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--seed", type=int, default=11)  # the ranker's questions, not the eval's (7)
    ap.add_argument("--out", default=str(REPO / "bench/out/confidence.json"))
    args = ap.parse_args()
    dataset = Path(args.dataset)
    if args.reuse:
        rows = json.loads(dataset.read_text())
    else:
        rows = []
        for name in args.package or DEFAULT:
            rows += record_package(name, Path(args.work).resolve(), args)
        rows += record_xling(Path(args.xling_work).resolve(), Path(args.sdists).resolve())
        dataset.parent.mkdir(parents=True, exist_ok=True)
        dataset.write_text(json.dumps(rows))
    report, threshold = evaluate(rows)
    for key, value in report.items():
        print(f"{key:32s} model {value['model']}  old {value['old_rule']}")
    write_json(args.out, {"threshold": threshold, "report": report, "answers": len(rows)})


if __name__ == "__main__":
    main()
