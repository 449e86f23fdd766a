"""Calibrate the reader's honesty signals on the homes bench/eval/run.py built (its work folder):
top-3 cosine of real natural-language queries (each package's docstring sentences) against
off-topic questions, and the exact flag of real against made-up identifiers, per package.

Usage: python bench/eval/calibrate.py [--work bench/out/eval-work] [--package click ...]
       [--out bench/out/calibrate.json]"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.common import REPO, write_json  # noqa: E402
import run as eval_run  # noqa: E402

OFF_TOPIC = [
    "how do I bake sourdough bread", "what is the capital of France", "best hiking trails in the alps",
    "how to change a bicycle tyre", "recipe for chocolate cake", "who won the football world cup",
    "symptoms of the common cold", "how many moons does jupiter have", "learn to play the guitar",
    "cheap flights to tokyo", "how to knit a scarf", "history of the roman empire",
    "train a dog to sit", "grow tomatoes on a balcony", "what is photosynthesis",
    "how to meditate", "price of gold today", "how tall is mount everest",
    "write a wedding speech", "fix a leaking tap", "tips for a job interview", "how do volcanoes erupt",
    "paint a watercolor landscape", "what do pandas eat", "how to brew green tea",
    "rules of chess castling", "how to swim butterfly stroke", "plan a birthday party",
    "what causes rainbows", "how to save money on groceries",
]
WORDS = ["frob", "widget", "quux", "spline", "reticulate", "zorp", "blorb", "nimbus", "gizmo", "wobble"]


def made_up(real: list[str], rng: random.Random, n: int) -> list[str]:
    """Identifiers shaped like the real ones that name nothing: a real module path with an
    invented member, invented snake_case and CamelCase names."""
    out = []
    while len(out) < n:
        base = rng.choice(real).rsplit(".", 1)[0]
        a, b = rng.sample(WORDS, 2)
        out += [f"{base}.{a}_{b}", f"{a}_{b}_{rng.choice(WORDS)}", f"{a.title()}{b.title()}Manager"]
    return out[:n]


def calibrate(home: Path, code_root: Path, imports: tuple[str, ...]) -> dict:
    from mtrag_resources.serving.reader import IndexReader
    reader = IndexReader(home=str(home), log_proposals=False)
    try:
        rng = random.Random(11)
        exact, docstring = eval_run.collect_code_queries(code_root, imports, rng, 80)
        real_ids = [q["query"] for q in exact]
        fake_ids = made_up(real_ids, rng, 90)

        def top_cos(q: str) -> float:
            hits = reader.query(q, k=10)["hits"][:3]
            return max((h["cosine"] for h in hits if h["cosine"] is not None), default=-1.0)

        real_cos = sorted(top_cos(q["query"]) for q in docstring)
        off_cos = sorted(top_cos(q) for q in OFF_TOPIC)
        real_flags = [reader.query(q, k=5) for q in real_ids]
        fake_flags = [reader.query(q, k=5) for q in fake_ids]
        return {
            "real_nl_top_cosine": {"min": real_cos[0], "p05": real_cos[len(real_cos) // 20], "median": real_cos[len(real_cos) // 2]},
            "off_topic_top_cosine": {"max": off_cos[-1], "p95": off_cos[int(len(off_cos) * 0.95) - 1], "median": off_cos[len(off_cos) // 2]},
            "real_nl_low": sum(a["confidence"] == "low" for a in (reader.query(q["query"], k=10) for q in docstring)) / len(docstring),
            "off_topic_low": sum(reader.query(q, k=10)["confidence"] == "low" for q in OFF_TOPIC) / len(OFF_TOPIC),
            "real_identifiers_not_found": sum(not a["exact"]["matched"] for a in real_flags) / len(real_flags),
            "made_up_identifiers_not_found": sum(a["exact"]["identifier"] and not a["exact"]["matched"] for a in fake_flags) / len(fake_flags),
            "made_up_examples_flagged_wrongly": [q for q, a in zip(fake_ids, fake_flags) if a["exact"]["matched"] or not a["exact"]["identifier"]][:10],
            "real_examples_flagged_wrongly": [q for q, a in zip(real_ids, real_flags) if not a["exact"]["matched"]][:10],
        }
    finally:
        reader.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=str(REPO / "bench/out/eval-work"))
    ap.add_argument("--package", action="append", choices=sorted(eval_run.PACKAGES),
                    help="a package whose home run.py built (default: every one in --work)")
    ap.add_argument("--out", default=str(REPO / "bench/out/calibrate.json"))
    args = ap.parse_args()
    work = Path(args.work)
    names = args.package or [n for n in eval_run.PACKAGES if (work / n / "home").is_dir()]
    result = {}
    for name in names:
        spec = eval_run.PACKAGES[name]
        corpus = work / name / name
        code_root = corpus / spec["code"] if spec["code"] else corpus
        result[name] = calibrate(work / name / "home", code_root, spec["imports"])
    for name, figures in result.items():
        for key, value in figures.items():
            print(f"{name} {key}: {value}")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
