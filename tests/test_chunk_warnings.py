"""cas_chunks' warnings: the metadata's `warnings` are every file's (the source's state, shown in
the UI), `new_warnings` only those of the files this run parsed, which the asset logs: a watch
batch or a build that did not touch a file does not warn about it again."""
from __future__ import annotations

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.sources import load_sources
from mtrag_resources.stages.cas_chunks import build_cas_chunks
from mtrag_resources.stages.raw_source import build_raw_source
from tests.corpus import write_corpus

pytestmark = pytest.mark.unit


def test_only_the_files_parsed_by_a_run_warn_again(tmp_path):
    paths = write_corpus(tmp_path / "corpus")
    (paths["pkg"] / "broken.py").write_text("def broken(:\n    pass\n")
    settings = Settings(home=tmp_path / "home", sources=paths["sources"]).ensure()
    spec = next(s for s in load_sources(settings.sources_file) if s.id == "shop")

    def build() -> dict:
        build_raw_source(settings, spec)
        return build_cas_chunks(settings, spec).metadata

    first = build()
    assert any("broken.py" in w for w in first["new_warnings"])
    assert first["new_warnings"] == first["warnings"]

    (paths["pkg"] / "tax.py").write_text((paths["pkg"] / "tax.py").read_text() + "\n\ndef added():\n    return 1\n")
    second = build()
    assert second["files_parsed"] == 1
    assert any("broken.py" in w for w in second["warnings"])  # still the source's state
    assert second["new_warnings"] == []                        # but not said again

    (paths["pkg"] / "broken.py").write_text("def broken(:\n    return 2\n")
    third = build()
    assert [w for w in third["new_warnings"] if "broken.py" in w]
