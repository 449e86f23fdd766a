"""Dev evaluation over several packages of different authors: gold answers come from each package's
own code and docs (PACKAGES pins each to an exact sdist; default: click, attrs, pluggy, rich).

Query sets, per package
- exact: a function/method/class's qualified name -> that symbol.
- docstring: a docstring's first sentence -> its function (CodeSearchNet style); the sentence is
  blanked in the indexed copy, so only the rest of the code can find it.
- doc_section: a docs section's heading + first sentence -> the code symbols it references
  (recall counts how many of them the code hits recover).
- bridge: a whole docs section (heading + body, as a maintainer pastes it) -> the answer's
  doc->code bridge; recall and precision of its symbols against the section's references,
  and how many sections the reader refused.
A section's references: Sphinx roles (:func:`x`, :py:meth:`~x`, :class:`title <x>`, func meth class
attr exc obj data) and their MyST form ({func}`x`), and in .rst the plain `x` where docs/conf.py's
default_role is py:obj, obj or any. Sections: markdown `#` to `####` headings, rst underlined (and
overlined) headings. `.. currentmodule::`/`.. module::` and `.. autoclass::`/`.. class::` (and their
MyST fences) qualify a relative target (`Group.command`, `.command`); otherwise the package's import
name does. A reference that resolves to no class, function or method of the package's code (ast;
re-exports through imports and `X = Y` count, and members inherited from a base class) is dropped,
and the drops are counted. A package whose sdist ships no docs has the code sets only.
Reports hit@1, recall@10 and MRR@10 for hybrid and each single channel, and latency p50/p95, per
package and as the macro average over the packages that have the set.

One home per package (sources `<pkg>` and `<pkg>-docs`), built and scored one after another; each
home's Neo4j is stopped once it is scored.

Usage: python bench/eval/run.py [--package click --package attrs ...] [--out bench/out/eval.json]
       [--limit 80] [--seed 7]
"""
from __future__ import annotations

import argparse
import ast
import bisect
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import REPO, fetch_sdist, mtrag_env, percentile, run_mtrag, stop_neo4j, wipe_work, write_json  # noqa: E402

# Each package: pin (an exact sdist version: click's dev pin, for the others the newest sdist
# `pip download --no-deps --no-binary :all: NAME` gave), code (the sdist folder holding the import
# packages: "src", or "" for the sdist's top), imports (its import names), docs (the docs folder,
# None where the sdist ships none) and formats (the docs files indexed and read for gold).
# Authors: click Pallets, attrs Hynek Schlawack, pluggy pytest-dev, rich Will McGugan, alembic Mike Bayer.
PACKAGES = {
    "click": {"pin": "8.5.1", "code": "src", "imports": ("click",), "docs": "docs", "formats": (".md",)},
    "attrs": {"pin": "26.1.0", "code": "src", "imports": ("attr", "attrs"), "docs": "docs",
              "formats": (".md", ".rst")},
    "pluggy": {"pin": "1.7.0", "code": "src", "imports": ("pluggy",), "docs": "docs", "formats": (".rst",)},
    "rich": {"pin": "15.0.0", "code": "", "imports": ("rich",), "docs": None, "formats": ()},
    "alembic": {"pin": "1.20.1", "code": "", "imports": ("alembic",), "docs": "docs/build", "formats": (".rst",)},
}
DEFAULT_PACKAGES = ("click", "attrs", "pluggy", "rich")

MODES = ("hybrid", "dense", "lexical", "exact")
CODE_SETS = (("exact", "code", False), ("docstring", "code", False), ("doc_section", "code", True))
# Sphinx roles (:func:`x`, :py:func:`x`) and their MyST form ({func}`x`), optionally "title <target>",
# the target optionally prefixed by `~` and/or `.`.
ROLE_RE = re.compile(r"(?::(?:py:)?|\{(?:py:)?)(?:func|meth|class|attr|exc|obj|data)(?::|\})`(?:[^`<]*<)?"
                     r"([~.]*[A-Za-z_][\w.]*)>?`")
# rst's default role: a plain `x` (not ``x``, not a role's, not a `link`_).
PLAIN_RE = re.compile(r"(?<![`\w:}])`(?:[^`<]*<)?([~.]*[A-Za-z_][\w.]*)>?`(?![`_\w])")
REFERENCE_ROLES = ("py:obj", "obj", "any")
MD_HEADING_RE = re.compile(r"^(#{1,4} .+)$", re.M)
RST_UNDERLINE_RE = re.compile(r"^([=\-~^\"'`#*+<>_:.!$%&,/;?@\\|])\1+\s*$")
MODULE_RE = re.compile(r"^\s*(?:\.\. (?:py:)?(?:currentmodule|module)::|[`~:]{3,}\{(?:py:)?(?:currentmodule|module)\})"
                       r"[ \t]*(\S+)")
CLASS_RE = re.compile(r"^([ \t]*)(?:\.\. (?:py:)?(?:autoclass|class|autoexception|exception)::|"
                      r"([`~:]{3,})\{(?:py:)?(?:autoclass|class|autoexception|exception)\})[ \t]*([\w.]+)")


def first_sentence(doc: str) -> str:
    text = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return m.group(1) if m else text


def sentence_re(sentence: str) -> str:
    return r"\s+".join(re.escape(w) for w in sentence.split())


def code_files(root: Path, imports: tuple[str, ...]) -> list[Path]:
    return sorted({p for imp in imports for p in (root / imp).rglob("*.py")})


def module_of(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def collect_code_queries(root: Path, imports: tuple[str, ...], rng: random.Random, limit: int):
    """(exact, docstring) queries of the code under root/<import name>; a docstring sentence that
    cannot be found in its file's text (escapes) is left out, as it could not be blanked."""
    exact, docstring = [], []
    for path in code_files(root, imports):
        module = module_of(path, root)
        source = path.read_text()
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                        item._qn = f"{module}.{node.name}.{item.name}"
                node._qn = f"{module}.{node.name}"
        for node in ast.walk(tree):
            qn = getattr(node, "_qn", None)
            if qn is None and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.col_offset == 0:
                qn = f"{module}.{node.name}"
            if qn is None or node.name.startswith("_"):
                continue
            exact.append({"query": qn, "gold": [qn], "file": path})
            doc = ast.get_docstring(node)
            if doc:
                sentence = first_sentence(doc)
                if len(sentence.split()) >= 6 and re.search(sentence_re(sentence), source):
                    docstring.append({"query": sentence, "gold": [qn], "file": path})
    rng.shuffle(exact)
    rng.shuffle(docstring)
    return exact[:limit], docstring[:limit]


def blank_sentences(queries: list[dict]) -> None:
    """Remove each query's sentence from the indexed copy (whitespace-insensitive match)."""
    by_file: dict[Path, list[str]] = {}
    for q in queries:
        by_file.setdefault(q["file"], []).append(q["query"])
    for path, sentences in by_file.items():
        text = path.read_text()
        for i, sentence in enumerate(sentences):
            text, n = re.subn(sentence_re(sentence), "", text, count=1)
            if n == 0 and sentence not in sentences[:i]:  # a second query of the same sentence: blanked
                raise RuntimeError(f"could not blank {sentence!r} in {path}")
        path.write_text(text)


class CodeNames:
    """What a package's code defines (ast): its classes, functions and methods by qualified name,
    each module's names (definitions, imports, `X = Y`) and each class's bases, to tell whether a
    docs reference resolves to something."""

    def __init__(self, root: Path, imports: tuple[str, ...]):
        self.defined: set[str] = set()
        self.names: dict[str, dict[str, str]] = {}   # module -> name -> qualified target
        self.star: dict[str, list[str]] = {}          # module -> modules it star-imports
        self.bases: dict[str, list[str]] = {}         # class -> its bases, as module-qualified text
        for path in code_files(root, imports):
            module = module_of(path, root)
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            self.names.setdefault(module, {})
            self._walk(ast.parse(path.read_text()).body, module, module, package)
        self.suffixes: dict[str, list[str]] = {}
        for qn in sorted(self.defined):
            parts = qn.split(".")
            for i in range(1, len(parts)):
                self.suffixes.setdefault(".".join(parts[i:]), []).append(qn)

    def _walk(self, body: list, prefix: str, module: str, package: str) -> None:
        top = prefix == module
        names = self.names[module]
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qn = f"{prefix}.{node.name}"
                self.defined.add(qn)
                if top:
                    names[node.name] = qn
                if isinstance(node, ast.ClassDef):
                    self.bases[qn] = [f"{module}.{ast.unparse(b)}" for b in node.bases
                                      if isinstance(b, (ast.Name, ast.Attribute))]
                    self._walk(node.body, qn, module, package)
            elif isinstance(node, (ast.If, ast.Try, ast.With)) or type(node).__name__ == "TryStar":
                for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                              *[h.body for h in getattr(node, "handlers", [])]):
                    self._walk(block, prefix, module, package)
            elif not top:
                continue
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    up = ".".join(parts[:len(parts) - node.level + 1])
                    base = f"{up}.{base}" if base else up
                for alias in node.names:
                    if alias.name == "*":
                        self.star.setdefault(module, []).append(base)
                    else:
                        names[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = alias.name
                    else:
                        names[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names[target.id] = f"{module}.{ast.unparse(node.value)}"

    def resolve(self, target: str, depth: int = 0) -> str | None:
        """The class, function or method `target` names (its qualified definition), or None."""
        if target in self.defined:
            return target
        if depth > 12:
            return None
        parts = target.split(".")
        for i in range(len(parts) - 1, 0, -1):
            head = ".".join(parts[:i])
            if head in self.names:
                name, rest = parts[i], parts[i + 1:]
                via = self.names[head].get(name)
                if via and via != f"{head}.{name}":
                    return self.resolve(".".join([via, *rest]), depth + 1)
                for star in self.star.get(head, ()):
                    found = self.resolve(".".join([star, name, *rest]), depth + 1)
                    if found:
                        return found
                break
        owner, _, member = target.rpartition(".")
        cls = self.resolve(owner, depth + 1) if owner else None
        for base in self.bases.get(cls, ()):
            found = self.resolve(f"{base}.{member}", depth + 1)
            if found:
                return found
        return None

    def qualify(self, raw: str, module: str | None, cls: str | None, imports: tuple[str, ...]) -> str | None:
        """The first qualified form of a reference as written that resolves: as written when it
        starts with an import name, else in its class, its current module, then the package; else
        the one definition whose qualified name ends with it (or a member of the one class whose
        name ends with its owner); None when none or several do. Where what it resolves to has
        another last name (attr.s = attr._make.attrs), the definition itself: gold_match compares
        last names."""
        relative = raw.lstrip("~").startswith(".")
        name = raw.lstrip("~.")
        tries = [name] if not relative and name.split(".")[0] in imports else []
        tries += [f"{ctx}.{name}" for ctx in (cls, module) if ctx]
        tries += [f"{imp}.{name}" for imp in imports]
        for t in dict.fromkeys(tries):
            found = self.resolve(t)
            if found:
                return t if found.rpartition(".")[2] == t.rpartition(".")[2] else found
        # As Sphinx's `.name` searches: the one definition whose name ends so (click's
        # `BoolParamType`, documented under `click` but defined in click.types and not re-exported)
        ends = self.suffixes.get(name, ())
        if len(ends) == 1:
            return ends[0]
        owner, _, member = name.rpartition(".")  # or a member its one such class inherits
        owners = self.suffixes.get(owner, ())
        found = self.resolve(f"{owners[0]}.{member}") if len(owners) == 1 else None
        if found:
            return f"{owners[0]}.{member}" if found.rpartition(".")[2] == member else found
        return None


def line_contexts(lines: list[str], imports: tuple[str, ...]) -> list[tuple[str | None, str | None]]:
    """Each line's (current module, current class) from the module and class directives above it."""
    module = cls = fence = None
    indent = 0
    out = []
    for line in lines:
        if cls is not None and line.strip():
            if fence:
                if line.strip().startswith(fence[:3]) and not line.strip().strip("`~:"):
                    cls = fence = None
            elif len(line) - len(line.lstrip()) <= indent:
                cls = None
        m = MODULE_RE.match(line)
        if m:
            module = None if m.group(1) == "None" else m.group(1)
        m = CLASS_RE.match(line)
        if m:
            name = m.group(3)
            cls = name if name.split(".")[0] in imports or not module else f"{module}.{name}"
            indent, fence = len(m.group(1)), m.group(2)
        out.append((module, cls))
    return out


def rst_sections(text: str) -> list[tuple[str, str, int]]:
    """(title, heading as written, body start, body end) offsets of each rst section: a title line
    over an underline at least as long, optionally overlined; a body runs to the next heading."""
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    heads = []
    for i in range(len(lines) - 1):
        title, under = lines[i], lines[i + 1]
        if (title.strip() and not title[0].isspace() and not RST_UNDERLINE_RE.match(title)
                and RST_UNDERLINE_RE.match(under) and len(under.rstrip()) >= len(title.rstrip())):
            top = i - 1 if i and lines[i - 1].rstrip() == under.rstrip() else i
            heads.append((top, i, i + 2))
    out = []
    for j, (top, i, body) in enumerate(heads):
        end = heads[j + 1][0] if j + 1 < len(heads) else len(lines)
        out.append((lines[i].strip(), "\n".join(lines[top:i + 2]), starts[body], starts[min(end, len(lines))]))
    return out


def default_role(docs: Path) -> str | None:
    conf = docs / "conf.py"
    m = re.search(r"^default_role\s*=\s*['\"]([^'\"]+)['\"]", conf.read_text(), re.M) if conf.exists() else None
    return m.group(1) if m else None


def collect_doc_queries(docs: Path, spec: dict, code: CodeNames, limit: int, whole: bool = False):
    """(queries, stats): the first `limit` sections with references and prose, and how many
    references the docs hold and how many were dropped as resolving to nothing in the code."""
    imports, plain = spec["imports"], default_role(docs) in REFERENCE_ROLES
    stats = {"sections": 0, "references": 0, "dropped": 0, "sections_dropped": 0, "dropped_examples": []}
    out = []
    for path in sorted({p for ext in spec["formats"] for p in docs.rglob(f"*{ext}")}):
        text = path.read_text()
        starts = [m.start() for m in re.finditer(r"^", text, re.M)]
        contexts = line_contexts(text.split("\n"), imports)
        rst = path.suffix == ".rst"
        if rst:
            sections = rst_sections(text)
        else:
            heads = list(MD_HEADING_RE.finditer(text))
            sections = [(m.group(1).lstrip("# ").strip(), m.group(1), m.end(),
                         heads[j + 1].start() if j + 1 < len(heads) else len(text)) for j, m in enumerate(heads)]
        for title, heading, start, end in sections:
            body = text[start:end]
            found = [(m.group(1), start + m.start()) for m in ROLE_RE.finditer(body)]
            if plain and rst:
                found += [(m.group(1), start + m.start()) for m in PLAIN_RE.finditer(body)]
            refs, dropped = set(), set()
            for raw, at in found:
                module, cls = contexts[bisect.bisect_right(starts, at) - 1]
                qualified = code.qualify(raw, module, cls, imports)
                (refs.add(qualified) if qualified else dropped.add(raw))
            refs = sorted(refs)
            if refs or dropped:
                stats["sections"] += 1
                stats["references"] += len(refs) + len(dropped)
                stats["dropped"] += len(dropped)
                stats["sections_dropped"] += not refs
                stats["dropped_examples"] += sorted(dropped)
            prose = [l for l in body.split("\n\n") if l.strip() and not l.lstrip().startswith(("```", ":", ".."))
                     and not (rst and l.strip("\n")[:1].isspace())]
            if refs and prose:
                sentence = first_sentence(prose[0])[:200]
                query = f"{heading}\n{body.strip()}" if whole else f"{title}: {sentence}"
                out.append({"query": query, "gold": refs})
    examples = stats.pop("dropped_examples")
    stats["dropped_examples"] = sorted(set(examples), key=lambda r: (-examples.count(r), r))[:15]
    return out[:limit], stats


def gold_match(symbol: str, gold: list[str], imports: tuple[str, ...]) -> bool:
    # Docs name the public re-export (click.echo); code defines click.utils.echo.
    return any(symbol == g or symbol.split(".")[-1] == g.split(".")[-1] and symbol.split(".")[0] in imports
               and "." in symbol for g in gold)


def score(reader, qset: list[dict], mode: str, kind: str | None, recall_all: bool, imports: tuple[str, ...]) -> dict:
    hit1 = rec = mrr = 0.0
    lat = []
    for q in qset:
        t0 = time.perf_counter()
        result = reader.query(q["query"], k=10, kind=kind, mode=mode)
        lat.append((time.perf_counter() - t0) * 1000)
        symbols = [h["symbol"] for h in result["hits"] if h["source_kind"] == "code"][:10]
        ranks = [i for i, s in enumerate(symbols) if gold_match(s, q["gold"], imports)]
        hit1 += bool(ranks and ranks[0] == 0)
        mrr += 1 / (ranks[0] + 1) if ranks else 0
        if recall_all:
            rec += sum(any(gold_match(s, [g], imports) for s in symbols) for g in q["gold"]) / len(q["gold"])
        else:
            rec += bool(ranks)
    n = max(1, len(qset))
    return {"n": len(qset), "hit@1": round(hit1 / n, 3), "recall@10": round(rec / n, 3), "mrr@10": round(mrr / n, 3),
            "p50_ms": round(percentile(lat, 50), 1), "p95_ms": round(percentile(lat, 95), 1)}


def score_bridge(reader, qset: list[dict], imports: tuple[str, ...]) -> dict:
    """Recall and precision of the bridge's symbols against each section's references."""
    from mtrag_resources.serving.reader import QueryError
    rec = prec = 0.0
    refused = answered = entries = 0
    lat = []
    for q in qset:
        t0 = time.perf_counter()
        try:
            result = reader.query(q["query"], k=10)
        except QueryError:
            refused += 1
            continue
        lat.append((time.perf_counter() - t0) * 1000)
        answered += 1
        symbols = list(dict.fromkeys(b["symbol"] for b in result["bridge"] if b.get("symbol")))
        entries += len(symbols)
        rec += sum(any(gold_match(s, [g], imports) for s in symbols) for g in q["gold"]) / len(q["gold"])
        prec += (sum(gold_match(s, q["gold"], imports) for s in symbols) / len(symbols)) if symbols else 0.0
    n = max(1, answered)
    return {"n": len(qset), "refused": refused, "recall": round(rec / n, 3), "precision": round(prec / n, 3),
            "symbols_per_answer": round(entries / n, 1),
            "p50_ms": round(percentile(lat, 50), 1) if lat else None, "p95_ms": round(percentile(lat, 95), 1) if lat else None}


def prepare(name: str, work: Path, args) -> dict:
    """Fetch and lay out one package's corpus, collect its query sets and blank the docstring
    sentences in the indexed copy."""
    spec = PACKAGES[name]
    sdist = fetch_sdist(f"{name}=={spec['pin']}", work / "sdists")
    pkg_work = work / name
    corpus = pkg_work / name
    code_root = corpus / spec["code"] if spec["code"] else corpus
    for imp in spec["imports"]:
        shutil.copytree(sdist / spec["code"] / imp, code_root / imp)
    rng = random.Random(args.seed)
    exact, docstring = collect_code_queries(code_root, spec["imports"], rng, args.limit)
    code = CodeNames(code_root, spec["imports"])  # before blanking: blanking only touches docstrings
    blank_sentences(docstring)
    sets = {"exact": exact, "docstring": docstring}
    info = {"pin": spec["pin"], "code": [f"{spec['code']}/{imp}".lstrip("/") for imp in spec["imports"]],
            "docs": spec["docs"], "formats": list(spec["formats"]), "default_role": None}
    includes = [f"{spec['code']}/**/*.py"] if spec["code"] else [f"{imp}/**/*.py" for imp in spec["imports"]]
    lines = [f"  - {{id: {name}, kind: code, path: {corpus}, include: [{', '.join(repr(i) for i in includes)}]}}"]
    if spec["docs"]:
        shutil.copytree(sdist / spec["docs"], corpus / "docs")
        info["default_role"] = default_role(corpus / "docs")
        sets["doc_section"], info["references"] = collect_doc_queries(corpus / "docs", spec, code, args.limit)
        sets["bridge"], _ = collect_doc_queries(corpus / "docs", spec, code, args.limit, whole=True)
        docs_includes = ", ".join(repr(f"docs/**/*{ext}") for ext in spec["formats"])
        lines.append(f"  - {{id: {name}-docs, kind: docs, path: {corpus}, include: [{docs_includes}]}}")
    sources = pkg_work / "sources.yaml"
    sources.write_text("sources:\n" + "".join(f"{line}\n" for line in lines))
    return {"sets": sets, "info": info, "env": mtrag_env(pkg_work / "home", sources), "home": pkg_work / "home"}


def evaluate(name: str, work: Path, args) -> tuple[dict, dict]:
    prepared = prepare(name, work, args)
    info, sets, env = prepared["info"], prepared["sets"], prepared["env"]
    refs = info.get("references")
    print(f"[eval] {name}=={info['pin']}: code {', '.join(info['code'])}, docs {info['docs']} {info['formats']}, "
          f"default_role {info['default_role']}; "
          + (f"{refs['references']} references in {refs['sections']} sections, {refs['dropped']} dropped "
             f"(resolve to nothing in the code), {refs['sections_dropped']} sections left with none"
             if refs else "no docs") + "; " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()), flush=True)
    imports = PACKAGES[name]["imports"]
    results = {}
    try:
        info["build_s"] = round(run_mtrag(["build"], env)[0], 1)
        print(f"[eval] {name}: built in {info['build_s']} s", flush=True)
        os.environ.update(env)
        from mtrag_resources.serving.reader import IndexReader
        reader = IndexReader(home=str(prepared["home"]), log_proposals=False)
        try:
            reader.query("warm up", k=3)
            for set_name, kind, recall_all in CODE_SETS:
                if sets.get(set_name):
                    results[set_name] = {mode: score(reader, sets[set_name], mode, kind, recall_all, imports)
                                         for mode in MODES}
            if sets.get("bridge"):
                results["bridge"] = {"hybrid": score_bridge(reader, sets["bridge"], imports)}
        finally:
            reader.close()
    finally:
        stop_neo4j(env)  # the build started this home's server
    if "bridge" in results:
        b = results["bridge"]["hybrid"]
        print(f"[eval] {name}: bridge over {b['n']} whole sections: recall {b['recall']}, precision "
              f"{b['precision']}, {b['refused']} refused, {b['symbols_per_answer']} symbols per answer", flush=True)
    return results, info


def macro(results: dict) -> dict:
    """The mean of each figure over the packages that have the set (n: their sum)."""
    out = {}
    for set_name in ("exact", "docstring", "doc_section", "bridge"):
        have = [r[set_name] for r in results.values() if set_name in r]
        if not have:
            continue
        out[set_name] = {}
        for mode in have[0]:
            rows = [h[mode] for h in have]
            avg = out[set_name][mode] = {"n": sum(r["n"] for r in rows), "packages": len(rows)}
            for key in rows[0]:
                values = [r[key] for r in rows]
                if key == "refused":
                    avg[key] = sum(values)
                elif key != "n" and None not in values:
                    digits = 1 if key in ("p50_ms", "p95_ms", "symbols_per_answer") else 3
                    avg[key] = round(sum(values) / len(values), digits)
    return out


def tables(results: dict) -> dict[str, list[str]]:
    out = {}
    for set_name in ("exact", "docstring", "doc_section"):
        rows = [(pkg, by_set[set_name]) for pkg, by_set in results.items() if set_name in by_set]
        if not rows:
            continue
        table = ["| package | mode | n | hit@1 | recall@10 | MRR@10 | p50 ms | p95 ms |",
                 "|---|---|---|---|---|---|---|---|"]
        for pkg, by_mode in rows:
            for mode, r in by_mode.items():
                table.append(f"| {pkg} | {mode} | {r['n']} | {r['hit@1']} | {r['recall@10']} | {r['mrr@10']} | "
                             f"{r['p50_ms']} | {r['p95_ms']} |")
        out[set_name] = table
    rows = [(pkg, by_set["bridge"]["hybrid"]) for pkg, by_set in results.items() if "bridge" in by_set]
    if rows:
        table = ["| package | n | recall | precision | refused | symbols/answer | p50 ms | p95 ms |",
                 "|---|---|---|---|---|---|---|---|"]
        for pkg, b in rows:
            table.append(f"| {pkg} | {b['n']} | {b['recall']} | {b['precision']} | {b['refused']} | "
                         f"{b['symbols_per_answer']} | {b.get('p50_ms')} | {b.get('p95_ms')} |")
        out["bridge"] = table
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", action="append", choices=sorted(PACKAGES),
                    help=f"repeatable; default: {' '.join(DEFAULT_PACKAGES)}")
    ap.add_argument("--out", default=str(REPO / "bench/out/eval.json"))
    ap.add_argument("--work", default=str(REPO / "bench/out/eval-work"))
    ap.add_argument("--limit", type=int, default=80, help="per package and query set")
    ap.add_argument("--seed", type=int, default=7, help="each package's shuffle starts from it")
    args = ap.parse_args()
    packages = list(dict.fromkeys(args.package or DEFAULT_PACKAGES))
    work = Path(args.work)
    if work.is_dir():
        for sub in work.iterdir():
            if (sub / "home").is_dir():
                wipe_work(sub)  # stops that home's Neo4j first
    wipe_work(work)
    work.mkdir(parents=True)
    results, infos, failed = {}, {}, {}
    for name in packages:
        try:
            results[name], infos[name] = evaluate(name, work, args)
        except Exception as exc:  # the other packages still run; the run exits non-zero
            failed[name] = f"{type(exc).__name__}: {exc}"[-2000:]
            print(f"[eval] {name} failed: {failed[name]}", file=sys.stderr, flush=True)
    if len(results) > 1:
        results["macro"] = macro(results)
    by_set = tables(results)
    for set_name, table in by_set.items():
        print(f"\n{set_name}\n" + "\n".join(table))
    write_json(args.out, {"pins": {p: PACKAGES[p]["pin"] for p in packages}, "packages": infos, "failed": failed,
                          "build_s": {p: info.get("build_s") for p, info in infos.items()}, "results": results,
                          "tables": by_set})
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
