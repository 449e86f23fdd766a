"""Regenerate tests/snapshots/asset_graph.json, the oracle of tests/test_definitions.py.

The test never writes its own oracle: when it reports that the asset graph changed, review the
change, run this script by hand and commit the new snapshot with the code that changed it.

    .venv/bin/python scripts/update_asset_snapshot.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.test_definitions import SNAPSHOT, graph_snapshot  # noqa: E402  (after the path is set)


def main() -> int:
    current = json.dumps(graph_snapshot(), indent=1, sort_keys=True) + "\n"
    before = SNAPSHOT.read_text() if SNAPSHOT.exists() else None
    if current == before:
        print(f"{SNAPSHOT.relative_to(REPO)}: unchanged")
        return 0
    SNAPSHOT.write_text(current)
    print(f"{SNAPSHOT.relative_to(REPO)}: rewritten; review `git diff {SNAPSHOT.relative_to(REPO)}` before committing")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
