"""`mtrag query`, `mtrag paths`, `mtrag status`, `mtrag serve` and `mtrag demo` as real processes of
the installed console script (.venv/bin/mtrag) against a published home: exit codes and what they
print."""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))


def mtrag(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([MTRAG, *args], env=dict(os.environ), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_query_prints_ranked_hits_and_json(published):
    out = mtrag("query", "how is the total price with tax computed", "--k", "3")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "generation 1  query: 'how is the total price with tax computed'  mode: hybrid"
    ranked = [ln for ln in lines if re.match(r"^ +\d+\. ", ln)]
    assert [int(ln.split(".")[0]) for ln in ranked] == [1, 2, 3]
    assert any("shopcart.cart.Cart.total  [shop:src/shopcart/cart.py:" in ln for ln in ranked), lines
    assert not any("STALE" in ln for ln in lines)

    out = mtrag("query", "shopcart.tax.lookup_rate", "--mode", "exact", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["generation"] == 1 and result["mode"] == "exact" and result["stale"] == []
    assert result["hits"][0]["symbol"] == "shopcart.tax.lookup_rate"
    assert set(result["hits"][0]["channels"]) == {"exact"}

    out = mtrag("query", "税率", "--mode", "lexical", "--kind", "docs", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    hits = json.loads(out.stdout)["hits"]
    assert hits and {h["source_id"] for h in hits} == {"shop-docs"}
    assert any("税率" in h["text"] for h in hits)


def test_query_refusals_exit_2_with_one_line(published):
    out = mtrag("query", "tax", "--k", "0")
    assert out.returncode == 2
    assert out.stderr.strip() == "mtrag: k must be an integer from 1 to 100, got 0"
    assert out.stdout == ""
    out = mtrag("query", "   ")
    assert out.returncode == 2 and out.stderr.strip() == "mtrag: query is empty"
    out = mtrag("query", "tax", "--mode", "bogus")  # argparse's own refusal, also 2
    assert out.returncode == 2 and "invalid choice: 'bogus'" in out.stderr


def test_paths_prints_verified_call_chains(published):
    out = mtrag("paths", "--from", "shopcart.cart.Cart.total", "--max-hops", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "generation 1  paths from 'shopcart.cart.Cart.total'"
    chain = re.compile(r"^  shopcart\.cart\.Cart\.total -\[CALLS src/shopcart/cart\.py:\d+\]-> shopcart\.tax\.apply_tax"
                       r" -\[CALLS src/shopcart/tax\.py:\d+\]-> shopcart\.tax\.lookup_rate$")
    assert any(chain.match(ln) for ln in lines), lines

    out = mtrag("paths", "--from", "shopcart.cart.Cart", "--rel", "inherits", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    chains = [[n["qualified_name"] for n in p["nodes"]] for p in result["paths"]]
    assert ["shopcart.cart.Cart", "shopcart.cart.BaseCart"] in chains
    assert all(e["type"] == "INHERITS" for p in result["paths"] for e in p["edges"])

    out = mtrag("paths", "--from", "shopcart.tax.lookup_rate")  # a symbol that calls nothing
    assert out.returncode == 0
    assert out.stdout.splitlines()[1:] == ["  (no verified path)"]
    out = mtrag("paths", "--from", "shopcart.nothing.here")  # no such symbol: its nearest names (test_cli_errors.py)
    assert out.returncode == 1 and "no such symbol" in out.stderr and out.stdout == ""
    out = mtrag("paths", "--from", "shopcart.cart.Cart.total", "--rel", "OWNS")
    assert out.returncode == 2 and "unknown relation type(s) ['OWNS']" in out.stderr
    out = mtrag("paths", "--from", "shopcart.cart.Cart.total", "--max-hops", "9")
    assert out.returncode == 2 and "max_hops must be from 1 to 6, got 9" in out.stderr


def test_status_text_and_json(published):
    out = mtrag("status")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "published generation 1"
    assert [ln.split()[0] for ln in lines[1:3]] == ["shop", "shop-docs"]
    assert all(ln.count("=committed@") == 3 for ln in lines[1:3])
    assert lines[-1] == "  every store matches the manifest"
    out = mtrag("status", "--json")
    status = json.loads(out.stdout)
    assert out.returncode == 0 and status["generation"] == 1 and status["stale"] == []
    assert set(status["sources"]) == {"shop", "shop-docs"}


def test_status_of_a_home_without_a_generation_exits_1(tmp_path, published, monkeypatch):
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "empty-home"))
    out = mtrag("status")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == f"mtrag: MTRAG_HOME={tmp_path / 'empty-home'} has no published generation; run mtrag build"
    assert not (tmp_path / "empty-home").exists()  # a read command creates nothing


def _http(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The server's first stdout line, without blocking past `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mtrag serve exited {proc.returncode}: {proc.stderr.read()[-3000:]}")
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            return proc.stdout.readline()
    pytest.fail("mtrag serve printed nothing")


def test_serve_answers_http_until_stopped_by_pid(published):
    proc = subprocess.Popen([MTRAG, "serve", "--host", "127.0.0.1", "--port", "0"], env=dict(os.environ), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = _read_line(proc, timeout=120)
        m = re.match(r"^mtrag serving on (http://127\.0\.0\.1:(\d+)) \(POST /v1/query, GET /v1/status\)$", line.strip())
        assert m, line
        base, port = m.group(1), int(m.group(2))
        assert port > 0
        assert _http(base + "/healthz") == (200, {"ok": True})
        code, status = _http(base + "/v1/status")
        assert code == 200 and status["generation"] == 1 and status["stale"] == []
        code, answer = _http(base + "/v1/query", {"text": "shopcart.tax.lookup_rate", "k": 3})
        assert code == 200 and answer["generation"] == 1
        assert answer["hits"][0]["symbol"] == "shopcart.tax.lookup_rate"
        code, answer = _http(base + "/v1/query", {"text": "apply tax", "mode": "telepathy"})
        assert code == 422 and "telepathy" in answer["error"]["message"] and answer["error"]["field"] == "mode"
        code, answer = _http(base + "/v1/paths", {"from": "shopcart.cart.Cart.total", "rel": "CALLS", "max_hops": 1})
        assert code == 200 and [[n["qualified_name"] for n in p["nodes"]] for p in answer["paths"]] == \
            [["shopcart.cart.Cart.total", "shopcart.tax.apply_tax"]]

        os.kill(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: a clean stop
        assert proc.wait(timeout=60) == 0
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(base + "/healthz", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.slow
def test_demo_builds_the_configured_sources_and_prints_its_answers(mtrag_env):
    """`mtrag demo` honours MTRAG_SOURCES: here the test corpus stands in for this repository and
    the click sdist (its click-specific call path finds nothing in it, and says so)."""
    out = mtrag("demo", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"^== build: \['shop', 'shop-docs'\] in [\d.]+ s$", text, re.M), text[:2000]
    assert "== published generation 1; stale channels: 0" in text
    sections = re.split(r"^\n?== ", text, flags=re.M)
    titled = {s.splitlines()[0]: s.splitlines()[1:] for s in sections if s.strip()}
    for label, query in (("semantic question", "how do I prompt the user for a password on the command line"),
                         ("exact identifier", "click.core.Context.invoke"),
                         ("docs-to-code bridge", "how do I make a group of commands with subcommands")):
        body = titled[label]
        assert body[0].startswith(f"generation 1  query: {query!r}  mode: hybrid"), body
        ranked = [ln for ln in body if re.match(r"^ +\d+\. ", ln)]
        assert 1 <= len(ranked) <= 3  # the demo prints the top three
    assert all("[shop-docs:" in ln for ln in titled["docs-to-code bridge"] if re.match(r"^ +\d+\. ", ln))
    assert titled["call path from click.core.Context.invoke"] == [
        "generation 1  paths from 'click.core.Context.invoke'", "  (no verified path)"]
    assert titled["route path from GET /cart"][0] == "generation 1  paths from 'GET /cart'"  # no routes here
    assert titled["issue"][0].startswith("generation 1  query: '#8'  mode: hybrid")  # no issues source here
