"""The links stage's symbol index made from the last one (cross_source_links._index_updated: the
nodes gone and new taken out of and put into the entries they touch) is the index made from
scratch, entry by entry and node by node in order, and the tokens it says changed are those
changed_reads finds; where it cannot tell (other sources, nodes reordered, a large change) it
declines."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mtrag_resources.core.models import GraphNode, GraphRelation
from mtrag_resources.ingest.doc_links import changed_reads
from mtrag_resources.stages import cross_source_links as links

pytestmark = pytest.mark.unit

# Two sources' universes: qualified names repeat across the sources and within one (a module and a
# file of one name, a function and a method of one short name), so entries hold several nodes.
QNS = ["pkg.m0", "pkg.m0.C", "pkg.m0.C.run", "pkg.m0.run", "pkg.m1", "pkg.m1.C", "pkg.m1.C.run", "pkg/m0.py",
       "pkg/m1.py", "other/m0.py"]
LABELS = {"pkg.m0": "Module", "pkg.m1": "Module", "pkg.m0.C": "Class", "pkg.m1.C": "Class",
          "pkg.m0.C.run": "Method", "pkg.m1.C.run": "Method", "pkg.m0.run": "Function"}
UNIVERSE = {sid: [GraphNode(node_id=f"{sid}:{qn}:{v}", label=LABELS.get(qn, "File"),
                            name=qn.rsplit(".", 1)[-1].rsplit("/", 1)[-1], qualified_name=qn, source_id=sid)
                  for qn in QNS for v in range(2)] for sid in ("a", "b")}
CLASS_IDS = [n.node_id for sid in UNIVERSE for n in UNIVERSE[sid] if n.label == "Class"]


@st.composite
def source_state(draw, sid: str):
    """(node indexes present, renewed ones, INHERITS pairs, imports)."""
    nodes = draw(st.sets(st.integers(0, len(UNIVERSE[sid]) - 1), min_size=1))
    renewed = draw(st.sets(st.sampled_from(sorted(nodes))))
    inherits = draw(st.sets(st.tuples(st.sampled_from(CLASS_IDS), st.sampled_from(CLASS_IDS)), max_size=2))
    imports = draw(st.lists(st.tuples(st.sampled_from(["C", "run", "Name"]), st.sampled_from(QNS)), max_size=2))
    return nodes, renewed, inherits, imports


class Tables:
    """One source's rows as a process holds them: an unchanged row stays the same object, a renewed
    one is a value-equal new instance; an unchanged table is the same list."""

    def __init__(self, sid: str) -> None:
        self.sid, self.objects, self.state, self.lists = sid, {}, None, None

    def rows(self, state) -> tuple:
        nodes, renewed, inherits, imports = state
        if self.state == state and self.lists is not None:
            return self.lists
        made = {}
        for i in sorted(nodes):
            node = self.objects.get(i)
            made[i] = dataclasses.replace(UNIVERSE[self.sid][i]) if node is None or i in renewed else node
        self.objects = made
        last = self.lists
        inherits_rows = [GraphRelation(rel_id=f"{self.sid}{a}{b}", rel_type="INHERITS", src_id=a, dst_id=b)
                         for a, b in sorted(inherits)]
        import_rows = [{"module_qn": "pkg", "imported": target, "alias": name} for name, target in imports]
        self.lists = (self.sid, [made[i] for i in sorted(nodes)],
                      last[2] if last is not None and self.state[2] == inherits else inherits_rows,
                      last[3] if last is not None and self.state[3] == imports else import_rows)
        self.state = state
        return self.lists


def _same_index(a, b) -> None:
    for table in ("by_qn", "by_short", "files", "file_names"):
        x, y = getattr(a, table), getattr(b, table)
        assert {k: [id(n) for n in v] for k, v in x.items() if v} == {k: [id(n) for n in v] for k, v in y.items() if v}, table
    assert dict(a.bases) == {k: v for k, v in b.bases.items() if v}
    assert a.exports == b.exports


INHERITS_ACROSS = {("b:pkg.m1.C:0", "a:pkg.m0.C:0")}  # b's class inherits a's


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states=st.lists(st.tuples(source_state("a"), source_state("b")), min_size=2, max_size=5),
       share=st.sampled_from([0.25, float("inf")]))
@example(states=[(({0}, set(), set(), []), ({10}, set(), INHERITS_ACROSS, [])),  # the base class appears
                 (({0, 2}, set(), set(), []), ({10}, set(), INHERITS_ACROSS, []))], share=float("inf"))
def test_an_updated_index_is_the_index_from_scratch(states, share):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(links, "_UPDATE_SHARE", share)
        _updates(states, share)


def _updates(states, share) -> None:
    tables = {"a": Tables("a"), "b": Tables("b")}
    inputs = [tables["a"].rows(states[0][0]), tables["b"].rows(states[0][1])]
    index = links._index_of(inputs)
    for state_a, state_b in states[1:]:
        now = [tables["a"].rows(state_a), tables["b"].rows(state_b)]
        scratch = links._index_of(now)
        update = links._index_updated(inputs, index, now)
        if share > 1:  # nothing is too large a change; the rows keep their order
            assert update is not None
        if update is not None:
            updated, changed = update
            _same_index(updated, scratch)
            assert changed == changed_reads(index, scratch)
            index = updated
        else:
            index = scratch
        inputs = now
    _same_index(index, links._index_of(inputs))


def test_the_update_declines_other_sources_and_reordered_nodes():
    a, b = Tables("a"), Tables("b")
    state = ({0, 1, 2, 3}, set(), set(), [])
    inputs = [a.rows(state)]
    index = links._index_of(inputs)
    assert links._index_updated(inputs, index, [b.rows(state)]) is None
    sid, nodes, inherits, imports = inputs[0]
    assert links._index_updated(inputs, index, [(sid, nodes[::-1], inherits, imports)]) is None
    same = links._index_updated(inputs, index, [(sid, list(nodes), inherits, imports)])
    assert same is not None and same[1] == set()
