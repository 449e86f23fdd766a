import dagster as dg

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stages.raw_source import build_raw_source

from mtrag_assets.metadata import materialize_result, sample_table
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.policies import DEFAULT_FRESHNESS, GROUP_BUILD
from mtrag_assets.resources import MtragResource


@dg.asset(
    partitions_def=sources_partitions,
    code_version=CODE_VERSIONS["raw_source"],
    group_name=GROUP_BUILD,
    kinds={"python", "files"},
    freshness_policy=DEFAULT_FRESHNESS,
)
def raw_source(context: dg.AssetExecutionContext, mtrag: MtragResource) -> dg.MaterializeResult:
    """Snapshot of one source: every included file with size, sha256 and language, the git commit
    when the source is a folder in a git work tree (a pip sdist names its pin instead), and the
    files skipped with their reason (binary, too large, symlink leaving the root; a docs source's
    PDF without text - scanned, encrypted, unreadable - also in `skipped_documents` and as a
    warning in the run log). A `git:` source is the tree at its ref's commit, read from git objects
    (`ref`, `commit`, and how it was read: `git_scan`, `git_changed_paths`, `git_blobs_read`). File
    bytes are copied into the CAS, so later stages read this snapshot (a PDF's original bytes too).
    Data version = digest of the inventory."""
    settings = mtrag.settings()
    result = build_raw_source(settings, mtrag.spec(context.partition_key))
    # a PDF that gives no text; an include glob that selects nothing, a source with no file
    for warning in result.metadata.get("skip_warnings", []) + result.metadata.get("source_warnings", []):
        context.log.warning(warning)
    files = [f.__dict__ for f in result.value.files]
    return materialize_result(result, {"sample": sample_table(files, ["path", "language", "size", "status", "reason"])})
