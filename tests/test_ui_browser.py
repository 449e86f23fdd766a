"""The Dagster UI as a maintainer sees it after a build: `dagster dev` (webserver + daemon) on
127.0.0.1 over the instance a real build used, driven by headless Debian chromium through
Playwright. Screenshots are kept in the test's tmp_path."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.neo4j, pytest.mark.slow]  # dagster dev + chromium

REPO = Path(__file__).resolve().parents[1]
ASSET_KEYS = ["raw_source", "cas_chunks", "canonical_graph", "embedding_cache", "qdrant_collection", "fts_db",
              "neo4j_graph", "cross_source_links", "index_manifest"]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LOCATION_QUERY = ("{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus "
                  "locationOrLoadError { __typename ... on PythonError { message } } } } } }")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(base: str, query: str) -> dict:
    req = urllib.request.Request(f"{base}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def _wait_for_code_location(base: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    """/server_info answers before the code location has loaded; wait until it has."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster dev exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{base}/server_info", timeout=5):
                pass
            entries = _graphql(base, LOCATION_QUERY)["data"]["workspaceOrError"]["locationEntries"]
            last = entries
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                errors = [e for e in entries if e["locationOrLoadError"]["__typename"] == "PythonError"]
                assert not errors, f"code location failed to load: {errors}"
                return
        except (OSError, KeyError, TypeError, ValueError):
            pass
        time.sleep(1)
    pytest.fail(f"dagster dev not ready after {timeout}s (locations: {last}):\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def dagster_ui(published, tmp_path_factory):
    """`dagster dev -w workspace.yaml` on a free loopback port over the published build's
    instance; the whole process group (webserver, daemon, code servers) is killed afterwards."""
    assert Path(os.environ["DAGSTER_HOME"]) == published["home"] / "dagster_home"
    port = _free_port()
    log = tmp_path_factory.mktemp("dagster_dev") / "dagster_dev.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1",
             "-p", str(port)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for_code_location(base, proc, log)
        yield base
    finally:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:  # dagster dev waits for its children; whatever is left of the group goes now
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.fixture
def page(dagster_ui):
    from playwright.sync_api import sync_playwright
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup (installs Debian's chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1600, "height": 1000})
            pg.set_default_timeout(60_000)
            # The first visit to a new instance shows a community sign-up dialog over the page.
            pg.add_locator_handler(pg.get_by_role("button", name="Skip"), lambda skip: skip.click())
            yield pg
        finally:
            browser.close()


def test_asset_graph_partitions_and_checks_render(dagster_ui, page, tmp_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    from playwright.sync_api import expect

    # Asset graph, every group expanded: the nine asset keys are nodes of the graph.
    page.goto(f"{dagster_ui}/asset-groups")
    # The sign-up dialog can appear after the menu opened and close it: open it again then.
    for attempt in range(4):
        page.get_by_role("button", name="settings", exact=True).click()
        try:
            page.get_by_role("menuitem", name="Expand all groups").click(timeout=10_000)
            break
        except PlaywrightTimeoutError:
            page.keyboard.press("Escape")
    else:
        pytest.fail("the asset graph's settings menu never offered 'Expand all groups'")
    graph = page.locator("svg foreignObject")
    for key in ASSET_KEYS:
        expect(graph.get_by_text(key, exact=True)).to_be_visible()
    page.screenshot(path=tmp_path / "asset_graph.png")

    # One partitioned asset: both source partitions listed and materialized.
    page.goto(f"{dagster_ui}/assets/cas_chunks?view=partitions")
    expect(page.get_by_text("Materialized (2)", exact=True)).to_be_visible()
    expect(page.get_by_text("Missing (0)", exact=True)).to_be_visible()
    expect(page.get_by_text("Failed (0)", exact=True)).to_be_visible()
    page.screenshot(path=tmp_path / "cas_chunks_partitions.png")
    for key in ("shop", "shop-docs"):
        page.get_by_title(key, exact=True).first.click()
        expect(page).to_have_url(re.compile(rf"[?&]partition={re.escape(key)}(&|$)"))
        detail = page.get_by_text("Latest materialization", exact=True)
        expect(detail).to_be_visible()
        expect(page.get_by_text("Materialized", exact=True)).to_be_visible()
        expect(page.get_by_text("chunk_id", exact=True)).to_be_visible()  # the sample table's header
        page.screenshot(path=tmp_path / f"cas_chunks_{key}.png")

    # Checks of neo4j_graph: both blocking checks listed with a passed latest result.
    page.goto(f"{dagster_ui}/assets/neo4j_graph?view=checks")
    rows = page.locator("[class*=checkRow]")
    for name in ("counts_reconcile", "neo4j_marker_committed"):
        row = rows.filter(has=page.get_by_title(name, exact=True))
        expect(row).to_have_count(1)
        expect(row).to_contain_text("Succeeded")
        expect(row.locator("[aria-label=check_circle]")).to_be_visible()
    expect(page.get_by_text("Passed", exact=True).first).to_be_visible()
    page.screenshot(path=tmp_path / "neo4j_graph_checks.png")


def test_counters_render_as_tables_and_cli_builds_show_on_the_timeline(dagster_ui, page, tmp_path):
    """A counter in a materialization's metadata (canonical_graph's `relations_by_type`) is a
    rendered table on the asset page, not JSON text; `mtrag build`'s runs are on the Overview
    timeline in their jobs' rows (build_source, then build_source_and_publish for the last source)."""
    import dagster as dg
    from playwright.sync_api import TimeoutError as PlaywrightTimeout, expect

    page.goto(f"{dagster_ui}/assets/canonical_graph?view=partitions")
    page.get_by_title("shop", exact=True).first.click()
    expect(page).to_have_url(re.compile(r"[?&]partition=shop(&|$)"))
    expect(page.get_by_text("Latest materialization", exact=True)).to_be_visible()
    tables = page.locator(".dagster-markdown table")
    relations = tables.filter(has=page.locator("th", has_text=re.compile(r"^type$")))
    expect(relations.first).to_be_visible()
    expect(relations.first.locator("th", has_text=re.compile(r"^count$"))).to_be_visible()
    expect(relations.first.locator("td", has_text=re.compile(r"^CALLS$"))).to_be_visible()
    labels = tables.filter(has=page.locator("th", has_text=re.compile(r"^label$")))
    expect(labels.first.locator("td", has_text=re.compile(r"^Function$"))).to_be_visible()
    expect(page.get_by_text(re.compile(r'"CALLS":\s*\d'))).to_have_count(0)  # no JSON text of the counter
    expect(page.get_by_text(re.compile(r"\d\.\d{5,}"))).to_have_count(0)  # no unrounded float
    page.screenshot(path=tmp_path / "canonical_graph_shop_metadata.png", full_page=True)

    runs = dg.DagsterInstance.get().get_runs(filters=dg.RunsFilter(tags={"mtrag/trigger": "cli"}))
    by_job = {}
    for run in runs:
        by_job.setdefault(run.job_name, []).append(run.run_id)
    assert set(by_job) == {"build_source", "build_source_and_publish"}, by_job

    page.goto(f"{dagster_ui}/overview/activity/timeline?groupBy=job")
    # The runs are minutes old: on the default 12-hour range their chunk is a few pixels wide,
    # beside the "Now" line; the 1-hour range gives the hover a target of its own.
    page.get_by_role("button", name="1hr", exact=True).click()
    rows = page.locator("[class*=timelineRowContainer]")
    for job, run_ids in by_job.items():
        # The row's name links to the job of the workspace's code location (the runs' origin).
        row = rows.filter(has=page.locator(f'a[href="/locations/mtrag_assets.definitions/jobs/{job}"]'))
        expect(row).to_have_count(1, timeout=60_000)  # the timeline loads its runs in batches
        chunks = row.locator(".chunk-popover-target")
        expect(chunks.first).to_be_visible()
        # Hovering the row's run chunk lists its runs, each a link to the run's page.
        links = page.locator(", ".join(f'a[href$="/runs/{rid}"]' for rid in run_ids))
        # The popover renders after the hover, and a re-render of the row (the timeline refreshes
        # itself) can close it: leave and hover each chunk again, for up to 30 s in all.
        deadline = time.monotonic() + 30
        while not links.first.is_visible() and time.monotonic() < deadline:
            for i in range(chunks.count()):
                page.mouse.move(0, 0)
                chunks.nth(i).hover()
                try:
                    links.first.wait_for(state="visible", timeout=3_000)
                    break
                except PlaywrightTimeout:
                    continue
        expect(links.first).to_be_visible()
        page.screenshot(path=tmp_path / f"timeline_{job}.png")
        page.mouse.move(0, 0)


def test_runs_list_tags_leave_out_the_build_process(dagster_ui):
    """The tags the UI lists for a `mtrag build` run (GraphQL's run tags, which leave out
    Dagster's hidden `.dagster/` prefix): what a maintainer filters by, not the build process's
    host, pid and start time, which stay on the run for release_dead_runs."""
    import dagster as dg
    from mtrag_assets.policies import HOST_TAG, PID_TAG, PROC_START_TAG
    query = ('{ runsOrError(filter: {tags: [{key: "mtrag/trigger", value: "cli"}]}) '
             '{ ... on Runs { results { runId tags { key } } } } }')
    results = _graphql(dagster_ui, query)["data"]["runsOrError"]["results"]
    assert results
    for run in results:
        shown = {tag["key"] for tag in run["tags"]}
        assert shown == {"mtrag/trigger", "mtrag/source", "mtrag/publish", "dagster/partition",
                         "dagster/partition_set", "dagster/code_location"}, shown
        stored = dg.DagsterInstance.get().get_run_by_id(run["runId"]).tags
        assert {HOST_TAG, PID_TAG, PROC_START_TAG} <= set(stored)
