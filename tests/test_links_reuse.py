"""The links stage keeps a resolution across a new symbol index when no entry it read changed
(doc_links: SymbolIndex.reads, changed_reads, kept_resolutions): after any edit of the code's
entities, bases, re-exports or files, the references resolved with the kept resolutions give the
links a resolution from scratch gives, and an entity no reference reads keeps them all."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mtrag_resources.core.models import DocReference, GraphNode, GraphRelation
from mtrag_resources.ingest.doc_links import SymbolIndex, kept_resolutions, resolve_links

pytestmark = pytest.mark.unit

# A small universe, so that edits hit what references read: modules, classes with bases and
# methods, functions, files; re-exports from the package.
ENTITIES = (
    [("Module", f"pkg.m{m}") for m in range(3)]
    + [("Class", f"pkg.m{m}.C{c}") for m in range(3) for c in range(2)]
    + [("Method", f"pkg.m{m}.C{c}.run") for m in range(3) for c in range(2)]
    + [("Method", "pkg.m1.C0.close"), ("Method", "pkg.m2.C0.close")]
    + [("Function", f"pkg.m{m}.helper") for m in range(3)]
    + [("File", f"pkg/m{m}.py") for m in range(3)]
)
CLASSES = [qn for label, qn in ENTITIES if label == "Class"]
TARGETS = ["pkg.m0.helper", "helper", "C0.run", "pkg.C1", "pkg.m1.C0.run", "m2.C1", "run", "pkg.Helper",
           "pkg.m0.C1.close", "pkg.C1.run", "pkg.C0.close", "pkg/m1.py", "m2.py", "pkg.m2"]


@st.composite
def code(draw) -> tuple[frozenset, frozenset, frozenset]:
    """(entities present, INHERITS pairs, re-exports `pkg.Name -> target`)."""
    present = frozenset(draw(st.sets(st.sampled_from(ENTITIES), min_size=4)))
    bases = frozenset(draw(st.sets(st.tuples(st.sampled_from(CLASSES), st.sampled_from(CLASSES)), max_size=3)))
    exports = frozenset(draw(st.sets(st.tuples(st.sampled_from(["C1", "Helper", "C0"]),
                                               st.sampled_from([qn for _, qn in ENTITIES])), max_size=2)))
    return present, bases, exports


def _index(state) -> SymbolIndex:
    present, bases, exports = state
    nodes = [GraphNode(node_id=f"code:{qn}", label=label, name=qn.rsplit(".", 1)[-1].rsplit("/", 1)[-1],
                       qualified_name=qn, source_id="code") for label, qn in sorted(present)]
    by_id = {n.node_id: n for n in nodes}
    index = SymbolIndex()
    index.add_nodes(nodes)
    index.add_relations(by_id, [GraphRelation(rel_id=f"i{a}{b}", rel_type="INHERITS", src_id=f"code:{a}",
                                              dst_id=f"code:{b}") for a, b in sorted(bases) if a != b])
    index.add_imports([{"module_qn": "pkg", "imported": target, "alias": name} for name, target in sorted(exports)])
    return index


REFERENCES = [DocReference(chunk_id=f"doc#{i}", file_path=f"docs/{i // 12}.md", line=i, ref_kind=kind, role="func",
                           target=target, matched_text=target, module_context=context, source_id="docs")
              for i, (kind, target, context) in enumerate(
                  [(k, t, c) for t in TARGETS for k, c in (("role", ""), ("code_span", ""), ("role", "pkg.m1"))]
                  + [("file", "pkg/m1.py", ""), ("file", "m0.py", "")])]


def _links(index, resolved=None, reads=None, made=None):
    links, unresolved = resolve_links(index, REFERENCES, resolved, reads=reads, made=made)
    return [(l.rel_id, l.rel_type, l.src_id, l.dst_id, l.confidence, tuple(l.candidates)) for l in links], unresolved


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states=st.lists(code(), min_size=2, max_size=5))
@example(states=[(frozenset(ENTITIES), frozenset(), frozenset()),           # a method inherited ...
                 (frozenset(ENTITIES), frozenset({("pkg.m0.C1", "pkg.m1.C0")}), frozenset())])
@example(states=[(frozenset(ENTITIES), frozenset(), frozenset()),           # a re-export appears
                 (frozenset(ENTITIES), frozenset(), frozenset({("C1", "pkg.m2.C1")}))])
@example(states=[(frozenset(ENTITIES) - {("Function", "pkg.m2.helper")}, frozenset(), frozenset()),
                 (frozenset(ENTITIES), frozenset(), frozenset())])           # a short name gains a node
@example(states=[(frozenset(ENTITIES), frozenset(), frozenset()),
                 (frozenset(ENTITIES) - {("File", "pkg/m0.py")}, frozenset(), frozenset())])  # a file goes
@example(states=[(frozenset(ENTITIES), frozenset({("pkg.m0.C1", "pkg.m1.C0")}), frozenset()),
                 (frozenset(ENTITIES), frozenset({("pkg.m0.C1", "pkg.m2.C0")}), frozenset())])  # another base
@example(states=[(frozenset(ENTITIES), frozenset({("pkg.m0.C1", "pkg.m1.C0")}), frozenset()),
                 (frozenset(ENTITIES) - {("Method", "pkg.m1.C0.close")}, frozenset({("pkg.m0.C1", "pkg.m1.C0")}),
                  frozenset())])                                             # the base's method goes
@example(states=[(frozenset(ENTITIES), frozenset(), frozenset({("C1", "pkg.m2.C1")})),
                 (frozenset(ENTITIES) - {("Method", "pkg.m2.C1.run")}, frozenset(),
                  frozenset({("C1", "pkg.m2.C1")}))])                        # a re-exported class's member
def test_kept_resolutions_give_the_links_of_a_resolution_from_scratch(states):
    """With the memo of the links made last (`made`, by file) too: a file whose resolutions were
    all kept keeps what it made, without resolving a reference again."""
    index, resolved, reads, made = _index(states[0]), {}, {}, {}
    _links(index, resolved, reads, made)
    for state in states[1:]:
        new = _index(state)
        resolved, reads = kept_resolutions(index, new, resolved, reads)
        before = dict(made)
        untouched = {run for run, file in before.items() if all(key in resolved for key in file.keys)}
        got = _links(new, resolved, reads, made)
        assert got == _links(new)
        assert {run for run in made if made[run] is before.get(run)} == untouched
        index = new


def test_an_entity_no_reference_reads_keeps_every_resolution():
    base = (frozenset(ENTITIES), frozenset(), frozenset())
    index, resolved, reads = _index(base), {}, {}
    _links(index, resolved, reads)
    assert resolved and set(reads) == set(resolved)
    new = _index((base[0] | {("Function", "other.unrelated")}, base[1], base[2]))
    kept, _ = kept_resolutions(index, new, resolved, reads)
    assert set(kept) == set(resolved)
    short = _index((base[0] | {("Function", "other.run")}, base[1], base[2]))  # "run": a short name read
    kept, _ = kept_resolutions(index, short, resolved, reads)
    assert set(kept) < set(resolved)
