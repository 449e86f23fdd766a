"""Runs the golden queries (publish/golden.py) against a candidate generation before it is
published: a reader opened on the candidate's manifest (`ReaderCore(manifest_override=...)`)
queries the stores the candidate committed, exactly as `mtrag query` will once CURRENT names it.

Why here: asking the stores the way a user does is the reader's job, and the layers keep
`stages` (index_manifest) and `serving` apart, so the application (`mtrag_assets.index_manifest`)
hands `evaluate_candidate` to `build_index_manifest`, which decides with the ranks alone."""
from __future__ import annotations

from mtrag_resources.core.config import Settings
from mtrag_resources.publish.golden import GoldenFile
from mtrag_resources.serving.reader import ReaderCore


def evaluate_candidate(settings: Settings, golden: GoldenFile, manifest: dict) -> dict[str, int | None]:
    """Query id -> the best rank of an expected item in its top k on the candidate (None: missed).
    A query answered with a stale channel still counts as answered: the publish gate's checks
    (markers committed, counts reconciled) have passed before this runs."""
    core = ReaderCore(settings, proposals=False, manifest_override=manifest)
    try:
        return {q.id: q.rank(core.query(q.query, k=q.k, kind=q.kind, mode=q.mode)["hits"])
                for q in golden.queries}
    finally:
        core.close()
