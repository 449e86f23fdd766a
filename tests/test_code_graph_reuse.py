"""A resolution that reuses the last one's call results (a long-lived process: `mtrag watch`) makes
the graph a resolution from scratch makes, over any sequence of edits to a package: symbols added
and removed, imports, aliases and star imports changed, bases changed, modules added and removed."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mtrag_resources.ingest import code_graph
from mtrag_resources.ingest.chunking.code import chunk_code
from mtrag_resources.core.models import GraphNode, GraphRelation, ParsedFile
from mtrag_resources.ingest.code_graph import resolve_code_graph

pytestmark = pytest.mark.unit

MODULES = ("m0", "m1", "m2")
NAMES = ("f0", "f1")
CLASSES = ("C0", "C1")
METHODS = ("g0", "save")

calls = st.one_of(
    st.sampled_from(NAMES).map(lambda f: f"{f}()"),
    st.tuples(st.sampled_from(MODULES), st.sampled_from(NAMES)).map(lambda t: f"{t[0]}.{t[1]}()"),
    st.tuples(st.sampled_from(CLASSES), st.sampled_from(METHODS)).map(lambda t: f"{t[0]}().{t[1]}()"),
    st.sampled_from(METHODS).map(lambda m: f"self.{m}()"),
    st.sampled_from(METHODS).map(lambda m: f"super().{m}()"),
    st.sampled_from(METHODS).map(lambda m: f"obj.{m}()"),
    st.sampled_from(CLASSES).map(lambda c: f"A{c}()"),
)
imports = st.one_of(
    st.tuples(st.sampled_from(MODULES), st.sampled_from(NAMES + CLASSES))
      .map(lambda t: f"from pkg.{t[0]} import {t[1]}"),
    st.sampled_from(MODULES).map(lambda m: f"from pkg.{m} import *"),
    st.sampled_from(MODULES).map(lambda m: f"import pkg.{m} as {m}"),
    st.tuples(st.sampled_from(MODULES), st.sampled_from(CLASSES))
      .map(lambda t: f"from .{t[0]} import {t[1]} as A{t[1]}"),
)
bases = st.one_of(st.just(""), st.sampled_from(CLASSES), st.sampled_from(CLASSES).map(lambda c: f"A{c}"),
                  st.tuples(st.sampled_from(MODULES), st.sampled_from(CLASSES)).map(lambda t: f"{t[0]}.{t[1]}"))


@st.composite
def function(draw) -> str:
    body = draw(st.lists(calls, min_size=1, max_size=3))
    return "\n".join([f"def {draw(st.sampled_from(NAMES))}(obj):", *(f"    {c}" for c in body)])


@st.composite
def klass(draw) -> str:
    base = draw(bases)
    lines = [f"class {draw(st.sampled_from(CLASSES))}({base}):" if base else f"class {draw(st.sampled_from(CLASSES))}:"]
    for method in draw(st.sets(st.sampled_from(METHODS), min_size=1, max_size=2)):
        lines += [f"    def {method}(self, obj):", *(f"        {c}" for c in draw(st.lists(calls, min_size=1, max_size=2)))]
    return "\n".join(lines)


item = st.one_of(imports, function(), klass())  # one top-level statement of a module
package = st.dictionaries(st.sampled_from(MODULES), st.lists(item, max_size=4), min_size=1)
# An edit: in one module, add an item, or remove or replace the item at an index (mod its length),
# or remove the module.
edit = st.tuples(st.sampled_from(MODULES), st.sampled_from(("add", "remove", "replace", "drop_module")),
                 st.integers(0, 7), item)


def edited(modules: dict[str, list[str]], change) -> dict[str, list[str]]:
    module, op, index, new = change
    items = list(modules.get(module, []))
    if op == "drop_module":
        return {m: i for m, i in modules.items() if m != module}
    if op == "add" or not items:
        items.insert(index % (len(items) + 1), new)
    elif op == "remove":
        del items[index % len(items)]
    else:
        items[index % len(items)] = new
    return {**modules, module: items}


_PARSED: dict[tuple[str, str], object] = {}


def parse(modules: dict[str, list[str]]) -> list:
    """The files' ParsedFiles; an unchanged file's is the same object, as cas_chunks' memo gives it
    to the graph stage (resolve_code_graph then replays that file's edges: _FileCalls)."""
    files = {"pkg/__init__.py": "VERSION = 1\n",
             **{f"pkg/{m}.py": "\n\n".join(items) + "\n" for m, items in modules.items()}}
    out = []
    for path, text in sorted(files.items()):
        if (path, text) not in _PARSED:
            _PARSED[(path, text)] = chunk_code("pkg", path, text, "python")
        out.append(_PARSED[(path, text)])
    return out


_MEMOS = (code_graph._LAST_CALLS, code_graph._LAST_EDGES, code_graph._LAST_IDS, code_graph._LAST_FILES,
          code_graph._LAST_IMPORTS, code_graph._LAST_TABLES)


def graph(nodes, relations) -> tuple:
    return (sorted((n.node_id, n.label) for n in nodes),
            sorted((r.rel_id, r.rel_type, r.src_id, r.dst_id, r.confidence, tuple(r.candidates),
                    r.evidence_file, r.evidence_start) for r in relations))


def from_scratch(parsed: list) -> tuple:
    """The graph a fresh process makes, leaving this process's last resolution as it was."""
    kept = [(table, dict(table)) for table in _MEMOS]
    try:
        for table, _ in kept:
            table.clear()
        return graph(*resolve_code_graph("pkg", parsed, reuse=False))
    finally:
        for table, saved in kept:
            table.clear()
            table.update(saved)


F0 = "def f0(obj):\n    pass"
CALLS_F0 = "def f1(obj):\n    f0()"


# One edit per kind of table entry a call reads, each changing only that entry for the call that read
# it (the random edits below find these rarely): a name added elsewhere, an import alias, a star
# import, a re-export, a base, a method of that name elsewhere, a member of the call's own module.
@example({"m0": ["import pkg.m1 as m1", "def f1(obj):\n    m1.f0()"], "m1": ["def f1(obj):\n    pass"]},
         [("m1", "add", 0, F0)])
@example({"m0": [CALLS_F0], "m1": [F0]}, [("m0", "add", 0, "from pkg.m1 import f0")])
@example({"m0": ["import pkg.m1 as m1", "def f1(obj):\n    m1.f0()"], "m1": ["def f1(obj):\n    pass"], "m2": [F0]},
         [("m1", "add", 0, "from pkg.m2 import *")])  # a re-export through another module's star
@example({"m0": ["import pkg.m1 as m1", "def f1(obj):\n    m1.f0()"], "m1": ["def f1(obj):\n    pass"], "m2": [F0]},
         [("m1", "add", 0, "from pkg.m2 import f0")])  # ... through its import
@example({"m0": ["import pkg.m2 as m2", "def f1(obj):\n    m2.f0()"], "m1": [F0]},
         [("m2", "add", 0, "from pkg.m1 import f0")])  # ... of a module that was not there
@example({"m0": [CALLS_F0], "m1": [F0]}, [("m0", "add", 0, "from pkg.m1 import *")])
@example({"m0": ["class C0:\n    def save(self, obj):\n        pass",
                 "class C1:\n    def g0(self, obj):\n        self.save()"]},
         [("m0", "replace", 1, "class C1(C0):\n    def g0(self, obj):\n        self.save()")])
@example({"m0": ["class C0:\n    def save(self, obj):\n        pass",
                 "class C1:\n    def save(self, obj):\n        super().save()"]},
         [("m0", "replace", 1, "class C1(C0):\n    def save(self, obj):\n        super().save()")])
@example({"m0": ["def f1(obj):\n    obj.g0()"], "m1": [F0]},
         [("m1", "add", 0, "class C0:\n    def g0(self, obj):\n        pass")])
@example({"m0": [CALLS_F0]}, [("m0", "add", 0, F0)])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(package, st.lists(edit, min_size=1, max_size=8))
def test_reused_resolution_is_the_resolution_from_scratch(modules, edits):
    for table in _MEMOS:
        table.pop("pkg", None)
    for change in [None, *edits]:
        modules = edited(modules, change) if change else modules
        parsed = parse(modules)
        assert graph(*resolve_code_graph("pkg", parsed, reuse=True)) == from_scratch(parsed)


def test_an_unrelated_edit_reuses_the_other_calls():
    """The reuse is real: after a function is added to one module, the calls of the modules that
    did not read its name keep their results (they are not resolved again)."""
    code_graph._LAST_CALLS.pop("pkg", None)
    before = {"m0": ["def f0(obj):\n    f1()", "def f1(obj):\n    obj.save()"],
              "m1": ["from pkg.m0 import f1", "class C0:\n    def save(self, obj):\n        f1()\n        self.g0()"]}
    resolve_code_graph("pkg", parse(before), reuse=True)
    results = dict(code_graph._LAST_CALLS["pkg"][1])
    files = dict(code_graph._LAST_FILES["pkg"])
    imports = dict(code_graph._LAST_IMPORTS["pkg"])
    after = {**before, "m0": [*before["m0"], "def f2(obj):\n    f0()"]}
    parsed = parse(after)
    assert graph(*resolve_code_graph("pkg", parsed, reuse=True)) == from_scratch(parsed)
    # m1's file (the same ParsedFile) added its edges again as they were; m0's calls resolved anew
    replayed = {f.parsed.nodes[0].file_path for k, f in code_graph._LAST_FILES["pkg"].items() if files.get(k) is f}
    assert replayed == {"pkg/m1.py"}
    # ... and its import edges too (m1's `from pkg.m0 import f1` read no entry the edit changed)
    assert {f.parsed.nodes[0].file_path for k, f in code_graph._LAST_IMPORTS["pkg"].items()
            if imports.get(k) is f} == {"pkg/m1.py"}
    now = code_graph._LAST_CALLS["pkg"][1]
    kept = [k for k in results if k in now and now[k] is results[k]]
    assert {k[2] for k in kept} == {"pkg.m1"}  # m1's calls: the same result objects, not re-resolved
    assert any(k[2] == "pkg.m0" and now[k] is not results.get(k) for k in now)  # m0's: resolved again


def test_a_name_an_import_cycle_cut_keeps_nothing_to_reuse():
    """Where an import cycle cut a name, what the name resolved to depends on the order of the
    resolutions before it: such a source keeps no results to reuse and resolves whole each time."""
    code_graph._LAST_CALLS.pop("pkg", None)
    modules = {"m0": ["from pkg.m1 import *", "def f1(obj):\n    f0()"], "m1": ["from pkg.m0 import *", F0.replace("f0", "f1")]}
    parsed = parse(modules)
    assert graph(*resolve_code_graph("pkg", parsed, reuse=True)) == from_scratch(parsed)
    assert "pkg" not in code_graph._LAST_CALLS


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(package, st.lists(edit, min_size=1, max_size=6))
def test_the_names_an_edit_changed_are_every_by_qn_entry_that_differs(modules, edits):
    """changed_since looks only at the names of the files one resolver reads and the other does
    not (an unchanged file is the same ParsedFile): the same names a comparison of every entry of
    the two resolvers' by_qn finds."""
    old = code_graph._Resolver(parse(modules))
    for change in edits:
        modules = edited(modules, change)
        new = code_graph._Resolver(parse(modules))
        every = {("qn", qn) for qn, _ in new._qn_entries().items() ^ old._qn_entries().items()}
        assert new._qn_changed(old) == every
        old = new


def test_files_in_another_order_compare_every_name():
    """Where the shared files stand in another order, the first node of a name may be another:
    every entry is compared."""
    first = parse({"m0": ["def f0(obj):\n    pass"], "m1": ["def f1(obj):\n    pass"]})
    old, new = code_graph._Resolver(first), code_graph._Resolver(list(reversed(first)))
    assert new._qn_changed(old) == {("qn", qn) for qn, _ in new._qn_entries().items() ^ old._qn_entries().items()}
    assert old._qn_memo is not None  # the fallback was taken


TABLES = ("by_id", "by_qn", "language", "package", "methods_by_name", "members", "aliases", "stars", "module_index")


def tables(resolver) -> dict:
    """A resolver's symbol tables, their entries in order (the values by identity where they are nodes)."""
    def entries(table):
        return [(k, id(v) if isinstance(v, GraphNode) else v) for k, v in table.items()]
    return {name: entries(getattr(resolver, name)) for name in TABLES}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(package, st.lists(edit, min_size=1, max_size=6))
def test_tables_merged_from_the_files_parts_are_the_tables_built_file_by_file(modules, edits):
    """A long-lived process builds a resolver's tables from each file's part (kept while the file is
    the same ParsedFile): the same entries in the same order as the loop over every node."""
    memo: dict = {}
    for change in [None, *edits]:
        modules = edited(modules, change) if change else modules
        parsed = parse(modules)
        merged = code_graph._Resolver(parsed, memo=memo)
        assert merged.tables_merged
        assert tables(merged) == tables(code_graph._Resolver(parsed))
        # an unchanged file (the same ParsedFile) brings the part it had
        assert all(merged.file_tables[id(pf)] is memo[id(pf)] for pf in parsed
                   if id(pf) in memo and memo[id(pf)].parsed is pf)
        memo = merged.file_tables


def _file(path: str, nodes: list, defines: list[tuple[str, str]] = (), imports: list[dict] = ()) -> ParsedFile:
    """A hand-made file: `nodes` (node_id, label, qualified_name), DEFINES relations (src, dst)."""
    return ParsedFile(
        nodes=[GraphNode(node_id=i, label=label, name=qn.rsplit(".", 1)[-1], qualified_name=qn, file_path=path)
               for i, label, qn in nodes],
        relations=[GraphRelation(rel_id=f"{a}>{b}", rel_type="DEFINES", src_id=a, dst_id=b) for a, b in defines],
        imports=list(imports), language="python")


def test_names_two_files_both_define_keep_the_first_file_s_entry_when_merged():
    """Two files of one module name (`m.py` and `m/__init__.py`): each table keeps what the loop
    keeps (the first file's node, member and alias; both files' methods and star imports)."""
    def module(path, tag, bound):
        return _file(path, [(f"m:{tag}", "Module", "m"), (f"f:{tag}", "Function", "m.x"), (f"c:{tag}", "Class", "m.C"),
                            (f"s:{tag}", "Method", "m.C.save"), (f"t:{tag}", "Method", f"m.C.save_{tag}")],
                     [(f"m:{tag}", f"f:{tag}"), (f"m:{tag}", f"c:{tag}"), (f"c:{tag}", f"s:{tag}")],
                     [{"kind": "name", "module_qn": "m", "alias": "y", "bound": bound},
                      {"kind": "star", "module_qn": "m", "alias": "", "bound": bound}])
    files = [module("m.py", "a", "p.first"), module("m/__init__.py", "b", "p.second")]
    merged = code_graph._Resolver(files, memo={})
    assert merged.tables_merged
    assert tables(merged) == tables(code_graph._Resolver(files))
    assert merged.by_qn["m.x"].node_id == "f:a" and merged.aliases["m"] == {"y": "p.first"}
    assert merged.stars["m"] == ["p.first", "p.second"] and merged.language == {"m": "python"}


def test_a_method_several_files_define_is_listed_once_per_name():
    """The merge keeps a name's methods without repeats, in first-seen order, however many files
    define one (a name first met in the second file, repeated in the third and fourth)."""
    def module(path, tag, name):
        return _file(path, [(f"m:{tag}", "Module", name), (f"c:{tag}", "Class", f"{name}.C"),
                            (f"s:{tag}", "Method", f"{name}.C.save")],
                     [(f"m:{tag}", f"c:{tag}"), (f"c:{tag}", f"s:{tag}")])
    files = [module("n.py", "a", "n"), module("m.py", "b", "m"), module("m/__init__.py", "c", "m"),
             module("src/m.py", "d", "m"), module("src/n.py", "e", "n")]
    merged = code_graph._Resolver(files, memo={})
    assert merged.tables_merged
    assert tables(merged) == tables(code_graph._Resolver(files))
    assert merged.methods_by_name[("python", "save")] == ["n.C.save", "m.C.save"]


@pytest.mark.parametrize("case", ["node id in two files", "DEFINES into another file"])
def test_files_whose_parts_cannot_be_merged_alone_take_the_loop(case):
    """Which node a DEFINES relation reads depends on the files before it where a node id repeats or
    the relation ends in another file: those resolvers are built by the loop, with the same tables."""
    a = _file("a.py", [("m:a", "Module", "a"), ("f:x", "Function", "a.x")], [("m:a", "f:x")])
    if case == "node id in two files":
        b = _file("b.py", [("m:b", "Module", "b"), ("f:x", "Function", "b.x")], [("m:b", "f:x")])
    else:
        b = _file("b.py", [("m:b", "Module", "b")], [("m:b", "f:x")])
    merged = code_graph._Resolver([a, b], memo={})
    assert not merged.tables_merged
    assert tables(merged) == tables(code_graph._Resolver([a, b]))
    assert merged.members["a"] == {"x": "a.x"}  # the first file's node, read by both relations
