"""resolve_links with the caller's memo of the links it made (`made`, what the links stage keeps
between watch batches): whatever changes between two calls (references added, gone or kept, a
chunk's content hash, the symbols the index holds), the links equal a resolution without the memo,
and a reference that resolves as before keeps its link object (the links table's merge then finds
it unchanged by identity)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrag_resources.core.models import DocReference, GraphNode
from mtrag_resources.ingest.doc_links import SymbolIndex, resolve_links

pytestmark = pytest.mark.unit

_NAMES = ["pkg.echo", "pkg.Group", "pkg.Group.command", "pkg.core.echo", "other.echo"]
_TARGETS = ["echo", "pkg.echo", "Group.command", "pkg.Group", "missing.name", "~pkg.core.echo"]


def _node(qn: str, source: str = "code") -> GraphNode:
    return GraphNode(node_id=f"{source}:{qn}", label="Method" if qn.count(".") > 1 else "Function",
                     name=qn.rsplit(".", 1)[-1], qualified_name=qn, source_id=source)


def _index(nodes: list[GraphNode]) -> SymbolIndex:
    index = SymbolIndex()
    index.add_nodes(nodes)
    return index


_REF = st.builds(lambda chunk, target, kind: DocReference(
    chunk_id=f"c{chunk}", file_path=f"docs/{chunk}.md", line=chunk, ref_kind=kind,
    role="func" if kind == "role" else "", target=target, matched_text=f"`{target}`", source_id="docs"),
    st.integers(0, 3), st.sampled_from(_TARGETS), st.sampled_from(["role", "backtick", "code_span"]))


@settings(max_examples=120, deadline=None)
@given(first=st.lists(_REF, max_size=10), added=st.lists(_REF, max_size=4), kept=st.lists(st.booleans(), max_size=10),
       names_before=st.sets(st.sampled_from(_NAMES), min_size=1), names_after=st.sets(st.sampled_from(_NAMES), min_size=1),
       rehashed=st.sets(st.integers(0, 3)))
def test_links_with_the_memo_equal_a_fresh_resolution(first, added, kept, names_before, names_after, rehashed):
    nodes = {qn: _node(qn) for qn in _NAMES}
    evidence = {f"c{i}": f"hash{i}" for i in range(4)}
    made: dict = {}
    before = resolve_links(_index([nodes[n] for n in sorted(names_before)]), first, {}, evidence, made)[0]
    assert before == resolve_links(_index([nodes[n] for n in sorted(names_before)]), first, {}, evidence)[0]

    # The next batch: some references kept (the same objects), new ones, some chunks' texts changed,
    # the index rebuilt over another set of symbols (kept symbols are the same node objects).
    refs = [r for r, keep in zip(first, kept + [True] * len(first)) if keep] + added
    evidence = {c: (h + "'" if int(c[1:]) in rehashed else h) for c, h in evidence.items()}
    index = _index([nodes[n] for n in sorted(names_after)])
    links, unresolved = resolve_links(index, refs, {}, evidence, made)
    fresh, fresh_unresolved = resolve_links(_index([nodes[n] for n in sorted(names_after)]), refs, {}, evidence)
    assert links == fresh and unresolved == fresh_unresolved
    assert all(link.evidence_hash == evidence[link.src_id.removeprefix("chunk:")] for link in links)

    # A third call with nothing changed hands back the very link objects of the second.
    again = resolve_links(index, refs, {}, evidence, made)[0]
    assert again == links and all(a is b for a, b in zip(again, links))


def test_a_changed_chunk_hash_makes_a_new_link_object():
    node = _node("pkg.echo")
    ref = DocReference(chunk_id="c1", file_path="docs/a.md", line=3, ref_kind="role", role="func",
                       target="pkg.echo", matched_text=":func:`pkg.echo`")
    made: dict = {}
    index = _index([node])
    [first] = resolve_links(index, [ref], {}, {"c1": "h1"}, made)[0]
    [same] = resolve_links(index, [ref], {}, {"c1": "h1"}, made)[0]
    [changed] = resolve_links(index, [ref], {}, {"c1": "h2"}, made)[0]
    assert same is first
    assert changed is not first and changed == dataclasses.replace(first, evidence_hash="h2")
    assert first.evidence_hash == "h1"  # the object an earlier table holds is not changed in place


@settings(max_examples=60, deadline=None)
@given(refs=st.lists(_REF, max_size=10), rehashed=st.sets(st.integers(0, 3)))
def test_a_kept_file_takes_its_chunks_new_hashes(refs, rehashed):
    """On one index with one `resolved` memo (a watch batch that changed no code), a file's
    references resolve as before; a chunk whose text changed still gets a link with its new hash."""
    index, resolved, made = _index([_node(qn) for qn in _NAMES]), {}, {}
    evidence = {f"c{i}": f"hash{i}" for i in range(4)}
    first = resolve_links(index, refs, resolved, evidence, made)[0]
    rehash = {c: (h + "'" if int(c[1:]) in rehashed else h) for c, h in evidence.items()}
    links = resolve_links(index, refs, resolved, rehash, made)[0]
    assert links == resolve_links(_index([_node(qn) for qn in _NAMES]), refs, {}, rehash)[0]
    assert all(link.evidence_hash == rehash[link.src_id.removeprefix("chunk:")] for link in links)
    again = resolve_links(index, refs, resolved, evidence, made)[0]
    assert again == first
