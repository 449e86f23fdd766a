import time

import dagster as dg

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stages.embedding_cache import build_embedding_cache

from mtrag_assets.cas_chunks import cas_chunks
from mtrag_assets.metadata import materialize_result
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.policies import DEFAULT_FRESHNESS, GROUP_BUILD
from mtrag_assets.resources import MtragResource

PROGRESS_AFTER_S = 2.0  # a pass shorter than this logs no progress


@dg.asset(
    deps=[cas_chunks],
    partitions_def=sources_partitions,
    code_version=CODE_VERSIONS["embedding_cache"],
    group_name=GROUP_BUILD,
    kinds={"onnx", "parquet", "duckdb"},
    freshness_policy=DEFAULT_FRESHNESS,
)
def embedding_cache(context: dg.AssetExecutionContext, mtrag: MtragResource) -> dg.MaterializeResult:
    """One vector per (embedder fingerprint, content hash) for the source's child chunks, in
    Parquet shards looked up with DuckDB. Only hashes missing from the cache are embedded, so an
    unchanged source costs nothing and an edit re-embeds only the chunks it changed."""

    meter = {"t0": time.perf_counter(), "last": 0.0, "done": 0}

    def progress(done: int, total: int) -> None:
        """`embedded done/total (N texts/s, ETA S s)`: every PROGRESS_AFTER_S of a pass that takes longer,
        and at its end (`mtrag build` prints these lines; the run log keeps them)."""
        now = time.perf_counter()
        if done < meter["done"]:  # a second pass (the multilingual embedder) starts over
            meter.update(t0=now, last=0.0)
        meter["done"] = done
        elapsed = now - meter["t0"]
        if elapsed < PROGRESS_AFTER_S or (done < total and now - meter["last"] < PROGRESS_AFTER_S):
            return
        meter["last"] = now
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else 0.0
        context.log.info(f"embedded {done}/{total} ({rate:.0f} texts/s, ETA {eta:.0f} s)")

    result = build_embedding_cache(mtrag.settings(), mtrag.spec(context.partition_key), mtrag.embedder(), log=progress,
                                   multilingual=mtrag.multilingual())
    return materialize_result(result)
