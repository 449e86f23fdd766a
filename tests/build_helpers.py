"""Helpers for integration tests that build through real Dagster runs."""
from __future__ import annotations

import dagster as dg

from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.sources import load_sources


def build(**kwargs) -> dict:
    from mtrag_assets.runner import run_build
    settings = Settings.from_env().ensure()
    return run_build(settings, load_sources(settings.sources_file), log=lambda *_: None, **kwargs)


def latest_metadata(asset: str, partition: str | None = None) -> dict:
    """The metadata of an asset's latest materialization on the test instance."""
    instance = dg.DagsterInstance.get()
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None),
        limit=1).records
    assert records, f"no materialization of {asset} {partition or ''}"
    meta = records[0].asset_materialization.metadata
    return {k: getattr(v, "value", v) for k, v in meta.items()}


def settings() -> Settings:
    return Settings.from_env()


def wait_stopped(proc, timeout: float = 300) -> None:
    """Wait until a build process froze itself at its fault point (MTRAG_FAULT_SIGNAL=STOP: state
    T in /proc); fail the test when it exits first or never gets there."""
    import time
    from pathlib import Path

    import pytest
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"build exited ({proc.returncode}) before its fault point:\n{out[-2000:]}\n{err[-3000:]}")
        try:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = ""
        if state == "T":
            return
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the build never reached its fault point")


def finish(proc, timeout: float = 400) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of a process started with text pipes; a process still running
    after `timeout` is killed and fails the test."""
    import subprocess

    import pytest
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"process did not finish in {timeout} s:\n{out[-2000:]}\n{err[-3000:]}")
    return proc.returncode, out, err
