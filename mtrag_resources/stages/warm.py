"""What a long-lived builder (`mtrag watch`) loads before its first change, so that the first
batch costs what the later ones do: every watched source's graph facts, decoded and built
(cas_chunks' memos), its chunk and graph tables as shared rows and the graph tables' Arrow form
for write_rows_changed's merge (stores/tables.py), the code graph's last resolution
(ingest/code_graph.py: its edges and their ids, and from now on what each call read, so that the
next resolution reuses the calls whose reads still hold; the links stage's references likewise),
and DuckDB for the stores' table diffs. Without it the first batch took nearly twice as long as
the next ones (docs/performance.md#stages)."""
from __future__ import annotations

from operator import attrgetter

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.models import DocReference, GraphNode, GraphRelation
from mtrag_resources.ingest.code_graph import keep_resolutions
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.publish.build_state import publishable_sources
from mtrag_resources.stages.canonical_graph import assemble_graph
from mtrag_resources.stages.cas_chunks import load_facts, load_parsed_files
from mtrag_resources.stages.common import chunk_set_generation
from mtrag_resources.stages.cross_source_links import compute_links, keep_link_resolutions
from mtrag_resources.stores.tables import adopt_rows, hold_arrow, hold_table, read_shared, read_table, table_exists


def warm_stage_memos(settings: Settings, source_ids: list[str], specs: list[SourceSpec] | None = None,
                     links: bool = True) -> int:
    """Load the memos for `source_ids`; returns the rows and facts files now in memory. With the
    sources' `specs`, each built source's code graph is resolved once too (nothing is written),
    and, with `links`, the links of every published source."""
    loaded = 0
    keep_resolutions()
    keep_link_resolutions()
    by_id = {s.id: s for s in specs or []}
    for sid in source_ids:
        layout = SourceLayout(settings, sid)
        parsed = load_parsed_files(layout)
        loaded += len(parsed) + len(load_facts(layout))
        if table_exists(layout.chunks):
            # the chunk stage filters the table it holds for the unchanged files' rows; the rows
            # below are decoded from the same read
            hold_table(layout.chunks, read_table(layout.chunks))
        chunks = read_shared(layout.chunks)
        loaded += len(chunks)
        if chunks:
            chunk_set_generation(chunks, sid)  # each row's line digested once, here
        for path, row_type in ((layout.nodes, GraphNode), (layout.relations, GraphRelation),
                               (layout.references, DocReference)):
            loaded += len(read_shared(path, row_type))
        for path in (layout.nodes, layout.relations):
            hold_arrow(path)
        if sid in by_id and table_exists(layout.nodes):
            # The first batch would resolve every call, base and import with no edge to reuse, and
            # hash every edge's id.
            nodes, relations, _references = assemble_graph(by_id[sid], parsed)
            # The tables' rows become the ones the first batch assembles again for every unchanged
            # file (the same objects), so its graph write and the links' index compare them by
            # identity, not field by field.
            adopt_rows(layout.nodes, sorted(nodes, key=attrgetter("node_id")), GraphNode)
            adopt_rows(layout.relations, sorted(relations, key=attrgetter("rel_id")), GraphRelation)
    if specs and links:
        # The first links stage would resolve every reference with no memo to keep them from
        # (the first build of a build server would pay for every reference)
        publishable = publishable_sources(settings, specs)
        if all(table_exists(SourceLayout(settings, s.id).references) for s in publishable):
            compute_links(settings, publishable)
    import duckdb  # noqa: F401 - the table diffs' engine: imported here, once
    import numpy.ma  # noqa: F401 - pyarrow's take of a NumPy index (a bucket's rows) imports it, once
    return loaded
