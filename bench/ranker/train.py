"""Train the learned ranker (mtrag_resources/serving/ranker.py) and measure it leave-one-package-out.

Questions come from bench/eval/run.py's sets of each package (docstring first sentences blanked in
the indexed copy, qualified names, doc sections with their references), built into one home per
package. Each hybrid question's fused head (the first ranker.HEAD candidates, with their features)
is recorded through the reader; a candidate is relevant when it is a gold symbol (run.py's
gold_match). Then, for each package, a model trained on the other packages reorders that
package's heads, and MRR@10 / hit@1 of the code hits are compared with the fused order: that is
the figure for packages the model never saw. Last, one model on every package is written to
`mtrag_resources/serving/data/ranker.txt` (or --model).

Usage: python bench/ranker/train.py [--package NAME]... [--dataset bench/out/ranker-data.json]
  --reuse   train from the recorded --dataset without building
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import REPO, built_reader, wipe_work, write_json  # noqa: E402
from bench.eval.run import PACKAGES, gold_match, prepare  # noqa: E402
from mtrag_resources.serving import ranker as ranker_mod  # noqa: E402

SETS = (("docstring", "code"), ("exact", "code"), ("doc_section", "code"))
K = 10
PARAMS = {"objective": "lambdarank", "metric": "ndcg", "ndcg_eval_at": [1, 10], "learning_rate": 0.05,
          "num_leaves": 15, "min_data_in_leaf": 20, "feature_fraction": 0.9, "bagging_fraction": 0.8,
          "bagging_freq": 1, "lambdarank_truncation_level": 20, "verbose": -1, "seed": 1, "num_threads": 2}
ROUNDS = 200


class Recorder:
    """Stands in for the reader's ranker: records each question's head and keeps the fused order."""

    def __init__(self) -> None:
        self.last: dict | None = None

    def reorder(self, query, fused, rows, cosines):
        ids, feats = ranker_mod.head_features(query, fused, rows, cosines)
        self.last = {"ids": ids, "features": feats,
                     "symbols": [rows[c].get("symbol") or "" for c in ids],
                     "code": [rows[c].get("source_kind") == "code" for c in ids]}
        return fused


def record(name: str, work: Path, args) -> list[dict]:
    prepared = prepare(name, work, args)
    env, sets, imports = prepared["env"], prepared["sets"], PACKAGES[name]["imports"]
    out = []
    with built_reader(prepared["home"], env) as reader:
        recorder = Recorder()
        reader._core().ranker = recorder
        for set_name, kind in SETS:
            for q in sets.get(set_name, []):
                recorder.last = None
                reader.query(q["query"], k=K, kind=kind)
                if recorder.last is None:
                    continue
                head = recorder.last
                labels = [int(gold_match(s, q["gold"], imports)) for s in head["symbols"]]
                out.append({"package": name, "set": set_name, "query": q["query"], "labels": labels,
                            "code": head["code"], "features": head["features"]})
    print(f"[ranker] {name}: {len(out)} questions recorded", flush=True)
    return out


def ranks(rows: list[dict], scores: list[list[float]] | None) -> list[int | None]:
    """The 0-based rank of the first relevant code hit within the top K, per question."""
    out = []
    for i, r in enumerate(rows):
        order = range(len(r["labels"])) if scores is None else sorted(range(len(r["labels"])),
                                                                         key=lambda j: (-scores[i][j], j))
        code = [j for j in order if r["code"][j]][:K]
        out.append(next((n for n, j in enumerate(code) if r["labels"][j]), None))
    return out


def summary(found: list[int | None]) -> dict:
    n = max(1, len(found))
    return {"n": len(found), "hit@1": round(sum(f == 0 for f in found) / n, 3),
            "mrr@10": round(sum(1 / (f + 1) for f in found if f is not None) / n, 3),
            "recall@10": round(sum(f is not None for f in found) / n, 3)}


def train(rows: list[dict]):
    import lightgbm
    import numpy as np
    useful = [r for r in rows if any(r["labels"])]
    x = np.array([f for r in useful for f in r["features"]], dtype=float)
    y = np.array([lab for r in useful for lab in r["labels"]])
    group = [len(r["labels"]) for r in useful]
    data = lightgbm.Dataset(x, y, group=group, feature_name=list(ranker_mod.FEATURES))
    return lightgbm.train(PARAMS, data, num_boost_round=ROUNDS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", action="append", choices=sorted(PACKAGES))
    ap.add_argument("--work", default=str(REPO / "bench/out/ranker-work"))
    ap.add_argument("--dataset", default=str(REPO / "bench/out/ranker-data.json"))
    ap.add_argument("--out", default=str(REPO / "bench/out/ranker.json"))
    ap.add_argument("--model", default=str(ranker_mod.MODEL))
    ap.add_argument("--limit", type=int, default=150)
    ap.add_argument("--seed", type=int, default=11, help="not bench/eval/run.py's 7: other questions")
    ap.add_argument("--reuse", action="store_true")
    args = ap.parse_args()
    packages = list(dict.fromkeys(args.package or ("click", "attrs", "pluggy", "rich", "alembic")))
    if args.reuse:
        rows = json.loads(Path(args.dataset).read_text())
    else:
        work = Path(args.work)
        wipe_work(work)
        work.mkdir(parents=True)
        rows = [r for name in packages for r in record(name, work, args)]
        Path(args.dataset).parent.mkdir(parents=True, exist_ok=True)
        Path(args.dataset).write_text(json.dumps(rows))
    report: dict = {"packages": packages, "params": PARAMS, "rounds": ROUNDS, "lopo": {}}
    table = ["| held-out package | set | n | fused hit@1 | fused MRR@10 | ranker hit@1 | ranker MRR@10 |",
             "|---|---|---|---|---|---|---|"]
    for held in packages:
        model = train([r for r in rows if r["package"] != held])
        test = [r for r in rows if r["package"] == held]
        scores = [list(model.predict(r["features"])) for r in test]
        for set_name, _ in SETS:
            idx = [i for i, r in enumerate(test) if r["set"] == set_name]
            if not idx:
                continue
            sub = [test[i] for i in idx]
            before = summary(ranks(sub, None))
            after = summary(ranks(sub, [scores[i] for i in idx]))
            report["lopo"].setdefault(held, {})[set_name] = {"fused": before, "ranker": after}
            table.append(f"| {held} | {set_name} | {before['n']} | {before['hit@1']} | {before['mrr@10']} | "
                         f"{after['hit@1']} | {after['mrr@10']} |")
    for set_name, _ in SETS:
        b = [v[set_name] for v in report["lopo"].values() if set_name in v]
        if b:
            mean = {w: {m: round(sum(x[w][m] for x in b) / len(b), 3) for m in ("hit@1", "mrr@10")}
                    for w in ("fused", "ranker")}
            report.setdefault("macro", {})[set_name] = mean
            table.append(f"| macro | {set_name} | | {mean['fused']['hit@1']} | {mean['fused']['mrr@10']} | "
                         f"{mean['ranker']['hit@1']} | {mean['ranker']['mrr@10']} |")
    print("\n".join(table))
    final = train(rows)
    final.save_model(args.model)
    importance = dict(zip(ranker_mod.FEATURES, (int(v) for v in final.feature_importance("gain"))))
    report.update(table=table, model=args.model, questions=len(rows), gain=importance)
    write_json(args.out, report)
    print(f"[ranker] model on {len(rows)} questions of {', '.join(packages)} -> {args.model}")


if __name__ == "__main__":
    main()
