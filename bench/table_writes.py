"""A one-file change to a built source's chunk, node and relation tables: the single Parquet file
rewritten whole (the layout before stores/bucketed.py) vs the bucketed table (only the changed
file's part written), and the store stages' comparison of the two versions (every row vs the
differing parts). The bucketed write twice: digesting every part, and told the changed file
(`changed_keys`: only its bucket is digested). Alternating in one process, median of the rounds
and the ratios.

    .venv/bin/python bench/table_writes.py --home bench/out/scale-work/home --source django
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrag_resources.stages.canonical_graph import NODE_BUCKETS, RELATION_BUCKETS  # noqa: E402
from mtrag_resources.stages.cas_chunks import CHUNK_BUCKETS  # noqa: E402
from mtrag_resources.stores import bucketed  # noqa: E402
from mtrag_resources.stores.table_delta import ProjectedTables, compare_tables  # noqa: E402
from mtrag_resources.stores.tables import read_table, write_table  # noqa: E402

# (table folder under the home, bucketing, key compared, the column a change alters)
TABLES = {
    "chunks": ("02-cas/tables/{sid}/chunks", CHUNK_BUCKETS, ("chunk_id",), "content_hash"),
    "nodes": ("03-graph/{sid}/nodes", NODE_BUCKETS, ("node_id",), "content_hash"),
    "relations": ("03-graph/{sid}/relations", RELATION_BUCKETS, ("rel_id",), "evidence_hash"),
}


def changed_version(table: pa.Table, bucketing, column: str, path: str, round_no: int) -> pa.Table:
    """The table with `column` altered on the rows of one file (what re-parsing it gives)."""
    mine = pc.equal(table[bucketing.key], path)
    altered = pc.if_else(mine, pc.binary_join_element_wise(table[column], pa.scalar(f"~{round_no}"), ""), table[column])
    return table.set_column(table.schema.get_field_index(column), column, altered)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench_table(name: str, table: pa.Table, bucketing, key, column, path: str, rounds: int, work: Path) -> dict:
    single_old, single_new, parts = work / f"{name}-old.parquet", work / f"{name}.parquet", work / name
    hinted = work / f"{name}-hinted"
    snapshot = ProjectedTables(work / f"{name}-snap")
    write_table(single_old, table)
    write_table(parts, table, bucketing=bucketing)
    write_table(hinted, table, bucketing=bucketing, changed_keys=())
    snapshot.save("g0", {name: parts})
    figures = {"single_write_s": [], "bucketed_write_s": [], "hinted_write_s": [],
               "single_compare_s": [], "bucketed_compare_s": [],
               "single_bytes": 0, "bucketed_bytes": [], "changed_rows": []}
    for r in range(rounds):
        new = changed_version(table, bucketing, column, path, r)
        s, _ = timed(lambda: write_table(single_new, new))
        b, counts = timed(lambda: write_table(parts, new, bucketing=bucketing))
        h, _ = timed(lambda: write_table(hinted, new, bucketing=bucketing, changed_keys={path}))
        assert bucketed.load_manifest(hinted)["parts"] == bucketed.load_manifest(parts)["parts"]
        figures["single_write_s"].append(s)
        figures["bucketed_write_s"].append(b)
        figures["hinted_write_s"].append(h)
        figures["single_bytes"] = single_new.stat().st_size
        figures["bucketed_bytes"].append(counts["bytes_written"])
        cols = tuple(table.column_names)
        s, delta_single = timed(lambda: compare_tables(single_new, single_old, key, cols))
        b, delta_parts = timed(lambda: compare_tables(parts, snapshot.load().tables[name], key, cols))
        assert sorted(delta_single.changed[key[0]].to_pylist()) == sorted(delta_parts.changed[key[0]].to_pylist())
        figures["single_compare_s"].append(s)
        figures["bucketed_compare_s"].append(b)
        figures["changed_rows"].append(delta_parts.changed.num_rows)
    out = {"rows": table.num_rows, "parts": bucketing.buckets, "file": path,
           "changed_rows": figures["changed_rows"][0], "single_bytes_written": figures["single_bytes"],
           "bucketed_bytes_written": int(statistics.median(figures["bucketed_bytes"]))}
    for k in ("single_write_s", "bucketed_write_s", "hinted_write_s", "single_compare_s", "bucketed_compare_s"):
        out[k] = round(statistics.median(figures[k]), 4)
    out["write_ratio"] = round(out["single_write_s"] / out["bucketed_write_s"], 2)
    out["hinted_write_ratio"] = round(out["single_write_s"] / out["hinted_write_s"], 2)
    out["compare_ratio"] = round(out["single_compare_s"] / out["bucketed_compare_s"], 2)
    out["bytes_ratio"] = round(out["single_bytes_written"] / max(1, out["bucketed_bytes_written"]), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", default="bench/out/scale-work/home")
    ap.add_argument("--source", default="django")
    ap.add_argument("--file", default="django/utils/text.py", help="the file whose rows change")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/out/table_writes.json")
    args = ap.parse_args()
    home = Path(args.home)
    results = {}
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        for name, (where, bucketing, key, column) in TABLES.items():
            folder = home / where.format(sid=args.source)
            if not bucketed.exists(folder):
                raise SystemExit(f"{folder}: no bucketed table (build the source with this tree first)")
            table = read_table(folder)
            results[name] = bench_table(name, table, bucketing, key, column, args.file, args.rounds, Path(tmp))
            print(f"{name}: {json.dumps(results[name])}", flush=True)
    doc = {"home": str(home), "source": args.source, "file": args.file, "rounds": args.rounds, "tables": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
