"""The golden-query gate (DESIGN "Generations and the query gate", 6): a candidate generation whose
golden recall@k drops is not published, CURRENT stays, the run names each regressed query with
its old and new rank, `mtrag status` says why; fixing the golden file or
`mtrag build --accept-quality-drop` (recorded in the manifest) publishes. Plus the golden file's
validation and the verdict's arithmetic, without any store."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import current_path
from mtrag_resources.publish.golden import (DEFAULT_MAX_DROP, DEFAULT_MIN_RECALL, KINDS, MODES, GoldenConfigError,
                                            QualityRefused, judge, load_golden, parse_golden)
from mtrag_resources.publish.manifest import latest_number, load_current
from mtrag_resources.serving.render import render_status

GOLDEN = """\
quality_gate: {{min_recall: 0.5, max_drop: 0.05}}
queries:
  - id: lookup-rate
    query: {name}
    mode: exact
    k: 3
    expect:
      - {{source: shop, file_path: src/shopcart/tax.py, symbol: shopcart.tax.{name}}}
  - id: cart-total
    query: total price including tax
    k: 3
    expect:
      - {{source: shop, file_path: src/shopcart/cart.py, symbol: shopcart.cart.Cart.total}}
  - id: guide
    query: regional taxes guide
    kind: docs
    k: 3
    expect:
      - {{source: shop-docs, file_path: guide.md}}
"""
RENAMED = "find_regional_rate"


def _write_golden(env: dict, name: str = "lookup_rate") -> Path:
    path = env["sources"].parent / "golden.yaml"  # the default place: beside sources.yaml
    path.write_text(GOLDEN.format(name=name))
    return path


def _rename_lookup_rate(env: dict) -> None:
    tax = env["pkg"] / "tax.py"
    tax.write_text(tax.read_text().replace("lookup_rate", RENAMED))


def _cli(capsys, *argv) -> tuple[int, str, str]:
    from mtrag_assets.app.cli import main
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _last_run_failure(instance: dg.DagsterInstance) -> str:
    run = instance.get_runs(limit=1)[0]
    assert run.status == dg.DagsterRunStatus.FAILURE
    failures = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    return "\n".join(e.dagster_event.step_failure_data.error.message for e in failures)


@pytest.mark.integration
@pytest.mark.neo4j
def test_refused_generation_keeps_current_names_the_query_and_publishes_once_the_golden_file_is_fixed(
        mtrag_env, capsys):
    from tests.build_helpers import build, latest_metadata
    s = Settings.from_env()
    _write_golden(mtrag_env)
    build()
    first = load_current(s.manifest_dir)
    assert first["generation"] == 1
    assert first["quality"]["recall"] == 1.0 and first["quality"]["baseline"] is None
    assert {q: v["rank"] for q, v in first["quality"]["per_query"].items()} == \
        {"lookup-rate": 1, "cart-total": 1, "guide": 1}
    meta = latest_metadata("index_manifest")
    assert meta["golden_recall"] == 1.0
    assert [r.data["id"] for r in meta["golden_per_query"].records] == ["lookup-rate", "cart-total", "guide"]
    current, latest = current_path(s.manifest_dir).read_bytes(), latest_number(s.manifest_dir)

    # A change that really breaks a golden query: the function it finds is renamed.
    _rename_lookup_rate(mtrag_env)
    with pytest.raises(dg.Failure) as info:
        build()
    message = str(info.value)
    assert "generation 2 not published by the golden-query gate" in message
    assert "lookup-rate: rank 1 -> not in top 3" in message
    assert "cart-total" not in message and "guide" not in message  # only the regressed query is named
    assert isinstance(info.value.__cause__, QualityRefused)
    assert current_path(s.manifest_dir).read_bytes() == current      # CURRENT as it was
    assert latest_number(s.manifest_dir) == latest                    # no manifest-2.json either
    assert "lookup-rate: rank 1 -> not in top 3" in _last_run_failure(dg.DagsterInstance.get())

    rc, out, _ = _cli(capsys, "status")
    assert rc == 0
    assert "REFUSED generation 2 by the golden-query gate" in out and "CURRENT stays at generation 1" in out
    assert "lookup-rate: rank 1 -> not in top 3 (query 'lookup_rate')" in out
    rc, out, _ = _cli(capsys, "status", "--json")
    status = json.loads(out)
    assert status["generation"] == 1
    assert status["quality_refused"]["regressed"] == [
        {"id": "lookup-rate", "query": "lookup_rate", "k": 3, "old_rank": 1, "new_rank": None}]

    # The maintainer updates the golden query to the new name: the next build publishes.
    _write_golden(mtrag_env, RENAMED)
    build()
    published = load_current(s.manifest_dir)
    assert published["generation"] == 2
    quality = published["quality"]
    assert quality["recall"] == 1.0 and quality["accepted_drop"] is None
    # the edited query is a new one; the two unchanged ones are compared with generation 1
    assert quality["baseline"] == {"generation": 1, "queries": 2, "recall_before": 1.0, "recall_after": 1.0,
                                   "drop": 0.0}
    assert quality["per_query"]["lookup-rate"]["previous_rank"] is None
    assert quality["per_query"]["cart-total"]["previous_rank"] == 1
    assert not s.quality_refusal.exists()
    rc, out, _ = _cli(capsys, "status")
    assert "REFUSED" not in out and "golden recall 1.000 (3/3 queries)" in out
    assert latest_metadata("index_manifest")["golden_previous_recall"] == 1.0


@pytest.mark.integration
@pytest.mark.neo4j
def test_accept_quality_drop_publishes_the_refused_generation_and_records_it(mtrag_env, capsys):
    from tests.build_helpers import build, latest_metadata
    s = Settings.from_env()
    _write_golden(mtrag_env)
    build()
    _rename_lookup_rate(mtrag_env)
    rc, out, err = _cli(capsys, "build")
    assert rc == 1 and "lookup-rate: rank 1 -> not in top 3" in err and "--accept-quality-drop" in err
    assert load_current(s.manifest_dir)["generation"] == 1

    rc, out, err = _cli(capsys, "build", "--accept-quality-drop")
    assert rc == 0, err
    assert "published despite the golden-query gate" in out
    manifest = load_current(s.manifest_dir)
    assert manifest["generation"] == 2
    accepted = manifest["quality"]["accepted_drop"]
    assert accepted["how"] == "mtrag build --accept-quality-drop"
    assert accepted["regressed"] == [{"id": "lookup-rate", "query": "lookup_rate", "k": 3, "old_rank": 1,
                                      "new_rank": None}]
    assert manifest["quality"]["recall"] == pytest.approx(2 / 3, abs=1e-6)
    assert not s.quality_refusal.exists()
    meta = latest_metadata("index_manifest")
    assert meta["golden_accepted_drop"] == "True" and meta["golden_recall"] == pytest.approx(2 / 3, abs=1e-6)
    rc, out, _ = _cli(capsys, "status")
    assert "published with an accepted golden-quality drop" in out and "REFUSED" not in out


# ------------------------------------------------------------------------------ without stores

def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "golden.yaml"
    path.write_text(textwrap.dedent(text))
    return path


Q = "{id: q1, query: hello, k: 3, expect: [{source: s, file_path: a.py}]}"


@pytest.mark.unit
@pytest.mark.parametrize("text, words", [
    ("- just a list\n", ["expected a mapping"]),
    ("queries: []\n", ["`queries` must be a non-empty list"]),
    (f"queries: [{Q}]\nquality_gate: {{min_recal: 0.5}}\n", ["quality_gate: unknown key", "min_recal"]),
    (f"queries: [{Q}]\nquality_gate: {{min_recall: 1.5}}\n", ["quality_gate.min_recall must be a number from 0 to 1"]),
    (f"queries: [{Q}]\nquality_gate: {{max_drop: yes}}\n", ["quality_gate.max_drop"]),
    (f"queries: [{Q}]\ngate: {{}}\n", ["unknown top-level key", "gate"]),
    ("queries: [{query: hello, k: 3, expect: [{source: s, file_path: a.py}]}]\n", ["queries[0] needs an `id`"]),
    (f"queries: [{Q}, {Q}]\n", ["query 'q1'", "duplicate id"]),
    ("queries: [{id: q1, query: '', k: 3, expect: [{source: s, file_path: a.py}]}]\n", ["query 'q1'", "`query`"]),
    ("queries: [{id: q1, query: hi, expect: [{source: s, file_path: a.py}]}]\n", ["query 'q1'", "`k` must be an integer"]),
    ("queries: [{id: q1, query: hi, k: 0, expect: [{source: s, file_path: a.py}]}]\n", ["query 'q1'", "from 1 to 100"]),
    ("queries: [{id: q1, query: hi, k: 3, kind: pdf, expect: [{source: s, file_path: a.py}]}]\n",
     ["query 'q1'", "kind 'pdf'"]),
    ("queries: [{id: q1, query: hi, k: 3, mode: fuzzy, expect: [{source: s, file_path: a.py}]}]\n",
     ["query 'q1'", "mode 'fuzzy'"]),
    ("queries: [{id: q1, query: hi, k: 3, expect: []}]\n", ["query 'q1'", "`expect` must be a non-empty list"]),
    ("queries: [{id: q1, query: hi, k: 3, expect: [{source: s}]}]\n", ["query 'q1'", "expect[0].file_path"]),
    ("queries: [{id: q1, query: hi, k: 3, expect: [{source: s, file_path: a.py, line: 3}]}]\n",
     ["query 'q1'", "expect[0]: unknown key", "line"]),
    ("queries: [{id: q1, query: hi, k: 3, expect: [{source: s, file_path: a.py}], top: 3}]\n",
     ["query 'q1'", "unknown key", "top"]),
    ("queries: [{id: q1, query: hi\n", ["not valid YAML"]),
])
def test_golden_file_validation_names_the_file_and_the_query(tmp_path, text, words):
    path = _file(tmp_path, text)
    with pytest.raises(GoldenConfigError) as info:
        load_golden(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    for word in words:
        assert word in message
    assert info.value.exit_code == 2  # a ConfigError: `mtrag build` exits 2


@pytest.mark.unit
def test_golden_file_defaults_and_no_file_means_no_gate(tmp_path):
    assert load_golden(tmp_path / "golden.yaml") is None
    golden = load_golden(_file(tmp_path, f"queries: [{Q}]\n"))
    assert (golden.min_recall, golden.max_drop) == (DEFAULT_MIN_RECALL, DEFAULT_MAX_DROP) == (0.0, 0.05)
    q = golden.queries[0]
    assert (q.id, q.mode, q.kind, q.k) == ("q1", "hybrid", None, 3)
    with pytest.raises(GoldenConfigError, match=r"query 'q1': expect\[0\].source 's' is not a configured source"):
        golden.unknown_sources(["shop"])


@pytest.mark.unit
def test_modes_and_kinds_are_the_readers():
    from mtrag_resources.serving.requests import KINDS as READER_KINDS, MAX_K, MODES as READER_MODES
    assert set(MODES) == set(READER_MODES) and tuple(KINDS) == tuple(READER_KINDS) and MAX_K == 100


@pytest.mark.unit
def test_golden_file_path_is_beside_the_sources_or_mtrag_golden(tmp_path, monkeypatch):
    monkeypatch.delenv("MTRAG_GOLDEN", raising=False)
    s = Settings(home=tmp_path / "home", sources=tmp_path / "conf" / "sources.yaml")
    assert s.golden_file == (tmp_path / "conf" / "golden.yaml").resolve()
    monkeypatch.setenv("MTRAG_GOLDEN", str(tmp_path / "elsewhere.yaml"))
    assert s.golden_file == (tmp_path / "elsewhere.yaml").resolve()


def _golden(n: int, gate: str = "") -> object:
    queries = [{"id": f"q{i}", "query": f"query {i}", "k": 5, "expect": [{"source": "s", "file_path": f"f{i}.py"}]}
               for i in range(n)]
    import yaml
    doc = {"queries": queries, **(yaml.safe_load(gate) if gate else {})}
    return parse_golden(doc, Path("golden.yaml"))


@pytest.mark.unit
def test_verdict_compares_only_what_the_published_generation_was_measured_on():
    golden = _golden(4)
    first = judge(golden, {"q0": 1, "q1": 2, "q2": 1, "q3": None}, None)
    assert first.passed and first.record["recall"] == 0.75 and first.record["baseline"] is None
    published = {"generation": 7, "quality": first.record}
    # q1 falls out of its top k: 0.75 -> 0.5 is a 0.25 drop > 0.05
    worse = judge(golden, {"q0": 1, "q1": None, "q2": 3, "q3": None}, published)
    assert not worse.passed
    assert worse.regressed == [{"id": "q1", "query": "query 1", "k": 5, "old_rank": 2, "new_rank": None}]
    assert worse.record["baseline"]["generation"] == 7 and worse.record["baseline"]["drop"] == 0.25
    assert worse.record["per_query"]["q1"]["status"] == "regressed"
    # a rank that moves inside the top k is no regression; a query found again is "fixed"
    better = judge(golden, {"q0": 4, "q1": 2, "q2": 1, "q3": 1}, published)
    assert better.passed and better.record["per_query"]["q3"]["status"] == "fixed"
    # an edited query (here: another k) is not compared with its old figures
    edited = parse_golden({"queries": [{**q, "k": 9} if q["id"] == "q1" else q for q in
                                       [{"id": f"q{i}", "query": f"query {i}", "k": 5,
                                         "expect": [{"source": "s", "file_path": f"f{i}.py"}]} for i in range(4)]]},
                          Path("golden.yaml"))
    moved = judge(edited, {"q0": 1, "q1": None, "q2": 1, "q3": None}, published)
    assert moved.passed and moved.record["baseline"]["queries"] == 3 and moved.regressed == []


@pytest.mark.unit
def test_verdict_min_recall_and_max_drop_bounds():
    golden = _golden(20, "quality_gate: {min_recall: 0.9, max_drop: 0.05}")
    all_found = {f"q{i}": 1 for i in range(20)}
    base = judge(golden, all_found, None)
    assert base.passed
    one_lost = judge(golden, {**all_found, "q3": None}, {"generation": 1, "quality": base.record})
    assert one_lost.passed  # 0.95: exactly max_drop below, and above min_recall
    two_lost = judge(golden, {**all_found, "q3": None, "q4": None}, {"generation": 1, "quality": base.record})
    assert not two_lost.passed and len(two_lost.reasons) == 1 and "max_drop" in two_lost.reasons[0]
    floor = judge(golden, {**all_found, "q3": None, "q4": None, "q5": None}, None)
    assert not floor.passed and "min_recall 0.900" in floor.reasons[0]
    assert [r["id"] for r in floor.regressed] == ["q3", "q4", "q5"]  # nothing to compare: the misses


@pytest.mark.unit
def test_status_shows_the_refusal_and_the_published_recall():
    refusal = {"candidate_generation": 5, "published_generation": 4, "refused_at": "T",
               "reasons": ["golden recall 0.5 is below ..."],
               "regressed": [{"id": "q1", "query": "hi", "k": 3, "old_rank": 2, "new_rank": None}]}
    result = {"generation": 4, "sources": {}, "stale": [], "quality_refused": refusal,
              "quality": {"recall": 1.0, "recalled": 2, "queries": 2, "baseline": None, "accepted_drop": None}}
    assert render_status(result).splitlines() == [
        "published generation 4",
        "  every store matches the manifest",
        "  golden recall 1.000 (2/2 queries)",
        "  REFUSED generation 5 by the golden-query gate (T); CURRENT stays at generation 4",
        "    golden recall 0.5 is below ...",
        "    q1: rank 2 -> not in top 3 (query 'hi')",
    ]


@pytest.mark.unit
def test_build_refuses_a_malformed_golden_file_before_building(tmp_path, monkeypatch, capsys):
    from tests.corpus import write_corpus
    paths = write_corpus(tmp_path / "corpus")
    (paths["sources"].parent / "golden.yaml").write_text(
        "queries: [{id: tax, query: tax, k: 3, expect: [{source: nope, file_path: a.py}]}]\n")
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MTRAG_SOURCES", str(paths["sources"]))
    monkeypatch.delenv("MTRAG_GOLDEN", raising=False)
    rc, out, err = _cli(capsys, "build")
    assert rc == 2
    assert "golden.yaml: query 'tax': expect[0].source 'nope' is not a configured source" in err
    assert not (tmp_path / "home" / "08-manifest" / "CURRENT").exists()
