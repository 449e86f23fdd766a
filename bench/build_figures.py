"""Figures of the latest build in an MTRAG_HOME, read back from its Dagster instance: per source and
stage the wall time and the stage's own counts and rates (chunks by kind, texts/s, store write
rates). Usage: MTRAG_HOME=data python bench/build_figures.py [--out FILE]"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_json  # noqa: E402

STAGE_KEYS = {
    "raw_source": ["files", "skipped", "bytes"],
    "cas_chunks": ["chunks", "parents", "children", "by_type", "files_parsed"],
    "canonical_graph": ["nodes", "relations", "references", "relations_by_type"],
    "embedding_cache": ["embedded", "cache_hits", "texts_per_s", "embed_seconds"],
    "qdrant_collection": ["points", "upserted", "points_per_s"],
    "fts_db": ["child_rows", "parent_rows", "alias_rows", "rows_per_s"],
    "neo4j_graph": ["total_nodes", "total_relationships", "rels_per_s"],
    "cross_source_links": ["links", "by_type", "by_confidence", "unresolved"],
    "index_manifest": ["generation", "chunks_after"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    home = Path(os.environ.get("MTRAG_HOME", "data")).resolve()
    os.environ.setdefault("DAGSTER_HOME", str(home / "dagster_home"))
    import dagster as dg
    instance = dg.DagsterInstance.get()
    figures: dict = {}
    for asset, keys in STAGE_KEYS.items():
        partitions = instance.get_dynamic_partitions("sources") if asset not in ("cross_source_links", "index_manifest") else [None]
        for pk in partitions:
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[pk] if pk else None), limit=1).records
            if not records:
                continue
            meta = {k: getattr(v, "value", v) for k, v in records[0].asset_materialization.metadata.items()}
            row = {k: meta.get(k) for k in keys if k in meta}
            row["seconds"] = meta.get("seconds")
            figures.setdefault(pk or "global", {})[asset] = row
    write_json(args.out, figures)


if __name__ == "__main__":
    main()
