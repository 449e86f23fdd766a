"""What a doc section references, and what those references resolve to: Sphinx/MyST roles with
their `~` and `.` prefixes and `currentmodule` context, rST interpreted text only under an object
default role (read from conf.py), literals never; targets through re-exports and inherited
members. The build (chunk_doc + doc_links) and the query-time bridge of a pasted section
(bridge.named_in_query / code_named) follow the same rules."""
from __future__ import annotations

import pytest

from mtrag_resources.core.models import GraphNode, GraphRelation
from mtrag_resources.ingest.chunking.docs import chunk_doc, pasted_references
from mtrag_resources.ingest.doc_links import SymbolIndex, resolve_links, resolve_reference
from mtrag_resources.ingest.sphinx_conf import default_role, default_roles
from mtrag_resources.serving.bridge import code_named, docs_default_role, named_in_query

pytestmark = pytest.mark.unit

# A click-like package: `click/__init__.py` re-exports from its modules; Group inherits `invoke`
# from Command; `click.testing` star-imports its helpers.
NODES = [
    GraphNode("n:core", "Module", "core", "click.core"),
    GraphNode("n:Command", "Class", "Command", "click.core.Command"),
    GraphNode("n:Command.invoke", "Method", "invoke", "click.core.Command.invoke"),
    GraphNode("n:Group", "Class", "Group", "click.core.Group"),
    GraphNode("n:Group.command", "Method", "command", "click.core.Group.command"),
    GraphNode("n:Context", "Class", "Context", "click.core.Context"),
    GraphNode("n:Context.invoke", "Method", "invoke", "click.core.Context.invoke"),
    GraphNode("n:echo", "Function", "echo", "click.utils.echo"),
    GraphNode("n:isolated", "Function", "isolated", "click._helpers.isolated"),
]
IMPORTS = [
    {"module_qn": "click", "imported": "click.core.Group", "alias": "Group", "kind": "from"},
    {"module_qn": "click", "imported": "click.core.Context", "alias": "Context", "kind": "from"},
    {"module_qn": "click", "imported": "click.utils.echo", "alias": "echo", "kind": "from"},
    {"module_qn": "click.testing", "imported": "click._helpers", "alias": "", "kind": "star"},
]
INHERITS = [GraphRelation("r1", "INHERITS", "n:Group", "n:Command", "VERIFIED", [], "core.py", 1, 1, "", "")]

SECTION = """\
Commands
========

.. currentmodule:: click

A :class:`Group` nests commands: decorate with :meth:`~Group.command` and call
:func:`.echo` to print. `Context.invoke` runs another command; the ``name`` parameter and
``True`` are literals, and so is `examples` unless the project's default role says otherwise.
:meth:`Group.invoke` is inherited from Command.

Example::

    :func:`not_a_reference` `nor_this`
"""


def index() -> SymbolIndex:
    idx = SymbolIndex()
    idx.add_nodes(NODES)
    idx.add_relations({n.node_id: n for n in NODES}, INHERITS)
    idx.add_imports(IMPORTS)
    return idx


def resolved(text: str, role: str = "") -> dict[str, list[str]]:
    """matched text -> the qualified names the build resolves it to."""
    refs = chunk_doc("docs", "guide.rst", text, "rst", default_role=role).references
    return {r.matched_text: [n.qualified_name for n in resolve_reference(index(), r)] for r in refs}


def test_conf_py_default_role_is_read_not_run():
    assert default_role('import os\nextensions = []\ndefault_role = "py:obj"\n') == "py:obj"
    assert default_role("default_role = 'any'  # the reST default role\n") == "any"
    assert default_role("os.exit(1)\n") == "" and default_role("def broken(:\n") == ""
    confs = {"docs/conf.py": 'default_role = "obj"\n', "other/conf.py": "project = 'x'\n"}
    roles = default_roles(["docs/api.rst", "docs/sub/guide.rst", "other/a.rst", "README.rst"], confs.get)
    assert roles == {"docs/api.rst": "obj", "docs/sub/guide.rst": "obj"}  # the nearest conf.py above each


def test_default_role_backticks_are_references_and_bridged():
    got = resolved(SECTION, role="py:obj")
    assert got["`Context.invoke`"] == ["click.core.Context.invoke"]
    assert got["`examples`"] == []  # a reference (to a page, for Sphinx), to nothing in the code
    assert "``name``" not in got and "``True``" not in got  # ``literal`` is a literal under any role
    names = {m: n for n, m, _ in named_in_query(SECTION, "py:obj")}
    assert names["`Context.invoke`"] == ("click.Context.invoke", "Context.invoke")


def test_without_a_default_role_backticks_are_literals():
    got = resolved(SECTION)
    assert not any(m.startswith("`") for m in got)
    names = [m for _, m, _ in named_in_query(SECTION)]
    assert names == [":class:`Group`", ":meth:`~Group.command`", ":func:`.echo`", ":meth:`Group.invoke`"]
    # Markdown (MyST) inline code is a literal whatever the default role
    md = "## Echo\n\nCall {func}`~click.echo`, not `click.echo` or `True`.\n\n```python\n{func}`x`\n```\n"
    assert [(r.role, r.target) for r in pasted_references(md, "py:obj")] == [("func", "click.echo")]


def test_tilde_and_dot_prefixes_and_currentmodule_context():
    got = resolved(SECTION)
    assert got[":meth:`~Group.command`"] == ["click.core.Group.command"]  # click.Group.command, re-exported
    assert got[":func:`.echo`"] == ["click.utils.echo"]
    assert got[":class:`Group`"] == ["click.core.Group"]
    # the same relative target outside `click`'s context needs the suffix of the defining class
    bare = resolved("Title\n=====\n\n:meth:`~Group.command`\n")
    assert bare[":meth:`~Group.command`"] == ["click.core.Group.command"]
    names = named_in_query(SECTION)
    assert names[1] == (("click.Group.command", "Group.command"), ":meth:`~Group.command`", "meth")
    assert names[2] == (("click.echo", "echo"), ":func:`.echo`", "func")


def test_a_re_exported_name_resolves_to_its_defining_module():
    got = resolved("API\n===\n\n:func:`click.echo` and :class:`click.Context`; :func:`click.testing.isolated`.\n")
    assert got[":func:`click.echo`"] == ["click.utils.echo"]
    assert got[":class:`click.Context`"] == ["click.core.Context"]
    assert got[":func:`click.testing.isolated`"] == ["click._helpers.isolated"]  # `from ._helpers import *`


def test_an_inherited_method_resolves_to_the_base_class_definition():
    got = resolved(SECTION)
    assert got[":meth:`Group.invoke`"] == ["click.core.Command.invoke"]  # click.Group.invoke -> Command
    bare = resolved("Title\n=====\n\n:meth:`Group.invoke`\n")  # no module context: by the class's suffix
    assert bare[":meth:`Group.invoke`"] == ["click.core.Command.invoke"]
    refs = chunk_doc("docs", "guide.rst", SECTION, "rst").references
    links, unresolved = resolve_links(index(), refs)
    assert unresolved == 0 and all(link.confidence == "VERIFIED" for link in links)


def test_a_suffix_guess_keeps_to_the_kind_of_code_its_role_names():
    got = resolved("Title\n=====\n\n:mod:`invoke`, :meth:`invoke` and :class:`Group`.\n")
    assert got[":mod:`invoke`"] == []  # no module of that name: not some class's method
    assert got[":meth:`invoke`"] == ["click.core.Command.invoke", "click.core.Context.invoke"]  # INFERRED
    assert got[":class:`Group`"] == ["click.core.Group"]
    assert resolved("Title\n=====\n\n:data:`command`\n")[":data:`command`"] == []  # a bare name: no method
    # a module is named by its full name, never relative to the current module (Sphinx's rule)
    modules = resolved(".. currentmodule:: click\n\nTitle\n=====\n\n:mod:`core` and :mod:`click.core`\n")
    assert modules == {":mod:`core`": [], ":mod:`click.core`": ["click.core"]}


class _Aliases:
    """The FTS store's exact lookup over symbol names (FtsStore.exact): qualified and short names,
    and a dotted query's last part as `last_part` candidates; and its rows (FtsStore.get_chunks)."""

    def __init__(self, nodes: list[GraphNode]):
        self.labels = {n.qualified_name: n.label for n in nodes}
        self.symbols = list(self.labels)

    def get_chunks(self, ids: list[str]) -> dict[str, dict]:
        return {c: {"symbol": c, "chunk_type": self.labels[c].lower()} for c in ids}

    def __call__(self, name: str) -> list[dict]:
        """Aliases compare case-insensitively, as the store's normalized ones do."""
        name, short = name.lower(), (lambda s: s.rsplit(".", 1)[-1])
        out = [self._hit(s, "exact", s) for s in self.symbols if s.lower() == name]
        out += [self._hit(s, "exact", short(s)) for s in self.symbols if short(s).lower() == name]
        if "." in name:
            out += [self._hit(s, "last_part", short(s)) for s in self.symbols if short(s).lower() == short(name)]
        return out

    @staticmethod
    def _hit(symbol: str, match: str, alias: str) -> dict:
        return {"chunk_id": symbol, "symbol": symbol, "alias": alias, "source_id": "code", "match": match}


def test_the_query_time_bridge_follows_the_same_rules():
    lookups = _Aliases(NODES)
    found = dict(code_named(lookups, SECTION, lookups, {"code"}))
    # roles resolved (`~`, `.`, the currentmodule's re-exports); literals and examples name nothing
    assert found == {"click.core.Group": ":class:`Group`", "click.core.Group.command": ":meth:`~Group.command`",
                     "click.utils.echo": ":func:`.echo`"}
    obj = dict(code_named(lookups, SECTION, lookups, {"code"}, default_role="py:obj"))
    assert obj == {**found, "click.core.Context.invoke": "`Context.invoke`"}
    # a question names code as prose does
    assert [c for c, _ in code_named(lookups, "what does click.echo print?", lookups, {"code"})] == ["click.utils.echo"]
    # a role names one kind of code: `:mod:` a module by its full name, `:class:`core`` nothing
    assert [c for c, _ in code_named(lookups, "See :mod:`click.core`.", lookups, {"code"})] == ["click.core"]
    assert code_named(lookups, ".. currentmodule:: click\n\n:mod:`core`", lookups, {"code"}) == []
    assert code_named(lookups, "See :class:`core`.", lookups, {"code"}) == []
    # a name is written as the code writes it; a bare name under a role that makes no member names
    # no method (`:data:`session``, a module's proxy, is not some class's `session`)
    assert code_named(lookups, "See :class:`group`.", lookups, {"code"}) == []
    assert code_named(lookups, "See :data:`command`.", lookups, {"code"}) == []
    assert [c for c, _ in code_named(lookups, "See :meth:`command`.", lookups, {"code"})] == ["click.core.Group.command"]


def test_the_docs_default_role_comes_from_the_manifest():
    manifest = {"sources": {"code": {"kind": "code"}, "docs": {"kind": "docs", "default_role": "py:obj"},
                            "notes": {"kind": "docs"}}}
    assert docs_default_role(manifest) == "py:obj"
    assert docs_default_role(manifest, {"notes", "code"}) == ""
    manifest["sources"]["other"] = {"kind": "docs", "default_role": "any"}
    assert docs_default_role(manifest) == ""  # two projects disagree: backticks read as literals


class _Graph:
    """The published MENTIONS edges of two doc passages (Neo4jStore.bridge, .resolved_references)."""

    EDGES = {"p-commands": [("click.core.Command.invoke", ":meth:`Group.invoke`"),
                            ("click.core.Group.command", ":meth:`~Group.command`")],
             "p-elsewhere": [("click.core.Context", ":class:`Context`")]}

    def bridge(self, chunk_ids: list[str], source_ids=None) -> list[dict]:
        return [dict(self._row(symbol, text), from_chunk_id=c, evidence={"text": text})
                for c in chunk_ids for symbol, text in self.EDGES.get(c, [])]

    def resolved_references(self, texts: list[str], source_ids=None) -> list[dict]:
        return [dict(self._row(symbol, text), text=text)
                for edges in self.EDGES.values() for symbol, text in edges if text in texts]

    @staticmethod
    def _row(symbol: str, text: str) -> dict:
        return {"symbol": symbol, "relation": "MENTIONS", "confidence": "VERIFIED", "source_id": "code",
                "file_path": "core.py", "start_line": 1}


def _bridge(hits: list[dict], query_code: list[dict]) -> list[tuple[str, str, int]]:
    from mtrag_resources.publish.gate import GateState
    from mtrag_resources.serving.bridge import doc_to_code_bridge

    manifest = {"sources": {"code": {"kind": "code"}, "docs": {"kind": "docs"}}}
    bridge, proposals = doc_to_code_bridge(_Graph(), None, manifest, hits, GateState(generation=1), query_code, SECTION)
    assert proposals == []  # a pasted section's passages are not guessed from
    return [(b["symbol"], b["via"], b["from_rank"]) for b in bridge]


OWN = {"chunk_id": "p-commands", "source_kind": "docs", "title": "Commands", "rank": 2, "file_path": "guide.rst",
       "start_line": 5, "source_id": "docs", "text": "\n".join(SECTION.split("Example::")[0].strip().split("\n")[-3:])}
ELSEWHERE = {"chunk_id": "p-elsewhere", "source_kind": "docs", "title": "Ctx", "rank": 1, "file_path": "ctx.rst",
             "start_line": 1, "source_id": "docs", "text": "Another page.\nOn contexts."}
# the query's names through the aliases: `~Group.command` to another symbol than the build's
ALIASED = [{"symbol": "click.core.Group", "matched_text": ":class:`Group`", "source_id": "code"},
           {"symbol": "click.decorators.command", "matched_text": ":meth:`~Group.command`", "source_id": "code"}]


def test_a_pasted_section_bridges_its_references_as_the_build_resolved_them():
    expected = [("click.core.Group", "query", 0), ("click.core.Group.command", "graph", 0),
                ("click.core.Command.invoke", "graph", 0)]
    # its own passage among the hits (another page's is not followed), or none of them
    assert _bridge([OWN, ELSEWHERE], ALIASED) == expected
    assert _bridge([ELSEWHERE], ALIASED) == expected


def test_the_chunk_stage_reads_the_default_role_of_the_conf_py_beside_the_pages(tmp_path):
    """A docs source that includes only its pages still has its conf.py read from disk; a changed
    default role parses the pages again (their references change, their text does not)."""
    from mtrag_resources.core.config import Settings
    from mtrag_resources.core.layout import SourceLayout, read_state
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.stages.cas_chunks import build_cas_chunks, load_parsed_files
    from mtrag_resources.stages.raw_source import build_raw_source

    docs = tmp_path / "proj" / "docs"
    docs.mkdir(parents=True)
    (docs / "conf.py").write_text('project = "shop"\ndefault_role = "py:obj"\n')
    (docs / "guide.rst").write_text("Guide\n=====\n\nUse `shopcart.tax.apply_tax`, not ``apply``.\n")
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"sources:\n  - {{id: docs, kind: docs, path: {tmp_path / 'proj'}, include: ['docs/**/*.rst']}}\n")
    settings = Settings(home=tmp_path / "home", sources=sources).ensure()
    spec = load_sources(settings.sources_file)[0]
    layout = SourceLayout(settings, spec.id)

    def references() -> list[tuple[str, str]]:
        build_raw_source(settings, spec)
        build_cas_chunks(settings, spec)
        return [(r.role, r.target) for _, parsed in load_parsed_files(layout) for r in parsed.references]

    assert references() == [("obj", "shopcart.tax.apply_tax")]
    assert read_state(layout)["default_role"] == "py:obj"  # what index_manifest publishes
    (docs / "conf.py").write_text('default_role = "code"\n')
    assert references() == []
    assert read_state(layout)["default_role"] == "code"  # no object role: backticks are literals
