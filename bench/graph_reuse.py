"""The code graph's resolution in a long-lived process (`mtrag watch`, code_graph.keep_resolutions):
after a one-file edit, resolving with the last resolution's call results reused where their reads
of the symbol tables still hold, against resolving from scratch, alternating in one process on a
built source's facts; each reused graph is checked equal to the one from scratch. Median of the
rounds and the ratio.

    .venv/bin/python bench/graph_reuse.py --home bench/out/scale-work/home --corpus bench/out/scale-work/corpus
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_json  # noqa: E402
from mtrag_resources.core.config import Settings  # noqa: E402
from mtrag_resources.core.layout import SourceLayout  # noqa: E402
from mtrag_resources.ingest import code_graph  # noqa: E402
from mtrag_resources.ingest.chunking.code import chunk_code  # noqa: E402
from mtrag_resources.stages.cas_chunks import load_parsed_files  # noqa: E402

# (file, text added at its end): a function, a subclass, a re-export; each round adds its own
EDITS = (
    ("django/utils/text.py", "\n\ndef graph_reuse_bench_{n}(value):\n    return slugify(value)\n"),
    ("django/utils/functional.py", "\n\nclass GraphReuseBench{n}(Promise):\n    def go(self):\n        return self.x()\n"),
    ("django/db/models/__init__.py", "\nfrom django.db.models.fields import Field as GraphReuseBench{n}\n"),
)


def graph(nodes, relations) -> tuple:
    return (sorted((n.node_id, n.label) for n in nodes),
            sorted((r.rel_id, r.rel_type, r.src_id, r.dst_id, r.confidence, tuple(r.candidates), r.evidence_file,
                    r.evidence_start) for r in relations))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", default="bench/out/scale-work/home")
    ap.add_argument("--corpus", default="bench/out/scale-work/corpus")
    ap.add_argument("--source", default="django")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default="bench/out/graph_reuse.json")
    args = ap.parse_args()
    parsed = load_parsed_files(SourceLayout(Settings(home=Path(args.home)), args.source))
    paths, files = [str(p) for p, _ in parsed], [pf for _, pf in parsed]
    code_graph.resolve_code_graph(args.source, files, reuse=True)  # the watch's warm-up resolution
    reused, scratch, calls = [], [], []
    for n in range(args.rounds):
        rel, added = EDITS[n % len(EDITS)]
        edited = list(files)
        text = (Path(args.corpus) / rel).read_text() + added.format(n=n)
        edited[paths.index(rel)] = chunk_code(args.source, rel, text, "python")
        before = dict(code_graph._LAST_CALLS[args.source][1])
        start = time.perf_counter()
        with_reuse = graph(*code_graph.resolve_code_graph(args.source, edited, reuse=True))
        reused.append(time.perf_counter() - start)
        after = code_graph._LAST_CALLS[args.source][1]
        calls.append(sum(1 for k, v in after.items() if before.get(k) is not v))
        kept = [(t, dict(t)) for t in (code_graph._LAST_CALLS, code_graph._LAST_EDGES, code_graph._LAST_IDS,
                                       code_graph._LAST_FILES, code_graph._LAST_IMPORTS)]
        for t, _ in kept:  # from scratch: as a fresh process, and the reuse chain goes on after
            t.pop(args.source, None)
        start = time.perf_counter()
        from_scratch = graph(*code_graph.resolve_code_graph(args.source, edited, reuse=False))
        scratch.append(time.perf_counter() - start)
        for t, saved in kept:
            t.clear()
            t.update(saved)
        if with_reuse != from_scratch:
            raise SystemExit(f"round {n} ({rel}): the reused resolution differs from the one from scratch")
        print(f"round {n} {rel}: reused {reused[-1]:.3f} s ({calls[-1]} calls resolved again), "
              f"from scratch {scratch[-1]:.3f} s", flush=True)
    out = {"source": args.source, "files": len(files), "call_keys": len(code_graph._LAST_CALLS[args.source][1]),
           "rounds": args.rounds, "reused_s": round(statistics.median(reused), 3),
           "scratch_s": round(statistics.median(scratch), 3),
           "calls_resolved_again_median": statistics.median(calls), "equal": True}
    out["speedup"] = round(out["scratch_s"] / out["reused_s"], 2)
    write_json(args.out, out)


if __name__ == "__main__":
    main()
