"""raw_source: the file inventory of one source, with every included file's bytes copied into
the CAS so later stages read a snapshot, not a working tree that may be changing. A git source's
bytes are its blobs at the ref's commit (read once, as the scan hashes them)."""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.git_source import ScanStats
from mtrag_resources.ingest.globs import matches_any
from mtrag_resources.ingest.snapshot import home_in_folder, scan_source, snapshot_files
from mtrag_resources.ingest.inventory import TOO_LARGE
from mtrag_resources.ingest.pdf import ENCRYPTED, is_pdf_skip
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stages.common import StageResult, timed
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.session import session_cache


# Per source, the paths (relative to its root) a watcher saw change, for the batch that is applying
# them (changed_paths): that batch's raw stage reads only those again, not the whole folder (a
# walk and a stat per file, every watch batch). One lost makes that batch walk the folder.
_CHANGED = session_cache("raw_source.changed_paths", max_entries=256)


@contextmanager
def changed_paths(changed: dict[str, set[str]]):
    """Within the block, build_raw_source of a source in `changed` rescans only its paths; the
    caller vouches that nothing else under the source's root changed since its last snapshot.
    Whatever the block did not take is dropped when it ends (a later build walks the folder)."""
    _CHANGED.update(changed)
    try:
        yield
    finally:
        for source_id in changed:
            _CHANGED.pop(source_id, None)


def build_raw_source(settings: Settings, spec: SourceSpec) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    meta: dict = {}
    with timed(meta, "seconds"):
        cas = ContentStore(settings.cas_dir)
        how = ScanStats()  # how the snapshot was taken (a git source's scan, a folder's rescan)
        changed = _CHANGED.pop(spec.id, None)
        # a git scan's blobs go into the CAS
        inventory = scan_source(settings, spec, keep=cas.put_bytes, stats=how, changed=changed)
        with snapshot_files(settings, spec, inventory) as read:
            for entry in inventory.included:
                if not cas.has(entry.sha256):
                    # Store under the hash of what we read now: a file edited mid-scan is recorded as read.
                    entry.sha256 = cas.put_bytes(read(entry))
        write_text_atomic(layout.inventory, inventory.to_json())
    included, skipped = inventory.included, inventory.skipped
    meta.update({
        "root": inventory.root,
        # An sdist is named by its pin (its unpacked folder has no commit of its own); a folder
        # by the commit of the git work tree it is in.
        **({"sdist": spec.pip_sdist} if spec.pip_sdist else {"commit": inventory.commit or "(not a git work tree)"}),
        # A git source: the tree at `ref`'s commit, and how it was read (unchanged: the same commit,
        # nothing read; diff: the changed paths of the two trees; full: every path).
        **({"ref": inventory.ref, "repository": inventory.repository, "git_scan": how.mode,
            "git_changed_paths": how.changed_paths, "git_blobs_read": how.blobs_read} if inventory.ref else {}),
        "files": len(included),
        # a folder: walked, or only the paths a watcher named read again (`mtrag watch`)
        **({} if inventory.ref or spec.kind == "issues" else {
            "folder_scan": f"rescan of {how.changed_paths} changed paths" if how.mode == "rescan" else "walk"}),
        "skipped": len(skipped),
        "bytes": sum(f.size for f in included),
        "by_language": dict(Counter(f.language for f in included)),
        "skipped_reasons": {f.path: f.reason for f in skipped[:50]},
        # Too large to index: named with their size however many other files were skipped (the
        # 50 above may all be binaries), since nothing of them is searchable. Largest first.
        "skipped_too_large": {f.path: f.size for f in sorted(
            (f for f in skipped if f.reason.startswith(TOO_LARGE)), key=lambda f: -f.size)[:50]},
        "warnings": {f.path: f.reason for f in included if f.reason}  ,
        # Documents meant to be read that give no text (a scanned, encrypted or unreadable PDF of a
        # docs source): named with their reason however many binaries were skipped; `skip_warnings`
        # are the lines the asset logs for them (`mtrag build` prints them).
        "skipped_documents": dict([(f.path, f.reason) for f in skipped if is_pdf_skip(f.reason)][:50]),
        "skip_warnings": [_skip_warning(f.path, f.reason) for f in skipped if is_pdf_skip(f.reason)][:50],
        # include globs that select nothing, a source with no file to index (a typo in a glob or
        # a path indexes nothing, and would otherwise go unnoticed): the asset logs them too
        "source_warnings": source_warnings(spec, inventory) + home_warnings(settings, spec, inventory),
        "inventory_digest": inventory.digest,
    })
    return StageResult(data_version=inventory.digest, metadata=meta, value=inventory)


def source_warnings(spec: SourceSpec, inventory) -> list[str]:
    """One line naming the source for each include glob no listed file matches, and one when the
    source has no file to index."""
    if spec.kind == "issues":  # one export file, not selected by globs
        return []
    paths = [f.path for f in inventory.files]
    out = [f"source {spec.id!r}: include glob {glob!r} matches no file" for glob in spec.include
           if not any(matches_any(p, (glob,)) for p in paths)]
    if not inventory.included:
        how = f"{len(inventory.skipped)} skipped" if inventory.skipped else "no file matches its include globs"
        out.append(f"source {spec.id!r}: no file to index under {inventory.root} ({how})")
    return out


def home_warnings(settings: Settings, spec: SourceSpec, inventory) -> list[str]:
    """One line when MTRAG_HOME lies inside a folder source, whose walk leaves it out."""
    home = home_in_folder(settings, Path(inventory.root)) if not inventory.ref and spec.kind != "issues" else None
    if not home:
        return []
    return [f"source {spec.id!r}: MTRAG_HOME ({settings.home}) is inside its folder, at {home!r}: "
            "not walked (mtrag's own output)"]


def _skip_warning(path: str, reason: str) -> str:
    if reason == ENCRYPTED:
        return f"{path}: skipped: encrypted PDF (it cannot be opened without a password; not indexed)"
    return f"{path}: skipped: {reason} (not indexed)"
