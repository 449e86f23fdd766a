"""A source's snapshot: its file inventory, read fresh or as the last build recorded it. Cheap
(stat + hash of changed files), so change detection runs it before Dagster or a model loads."""
from __future__ import annotations

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout, spec_root
from mtrag_resources.ingest.inventory import Inventory, scan
from mtrag_resources.ingest.sources import SourceSpec


def load_inventory(layout: SourceLayout) -> Inventory | None:
    try:
        return Inventory.from_json(layout.inventory.read_text())
    except FileNotFoundError:
        return None


def scan_source(settings: Settings, spec: SourceSpec) -> Inventory:
    """A fresh inventory, reusing the previous snapshot's hashes for files whose stat is unchanged.
    An sdist has no commit: the git HEAD found above its unpacked folder (MTRAG_HOME inside a
    repository) is the enclosing repository's, not the package's; its pin names it instead."""
    layout = SourceLayout(settings, spec.id)
    inventory = scan(spec.id, spec_root(settings, spec), spec.include, spec.exclude, spec.max_file_bytes,
                     previous=load_inventory(layout))
    if spec.pip_sdist:
        inventory.commit = ""
    return inventory
