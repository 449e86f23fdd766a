"""Every on-disk path mtrag uses, in one place: the stage folders under MTRAG_HOME, one source's
files in them, the published manifests, the links and proposals logs, and the build locks.

`Settings` inherits `HomeLayout`, so `settings.raw_dir` and friends keep reading naturally; code
that needs a path asks this module instead of joining strings of its own."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mtrag_resources.core.config import Settings
    from mtrag_resources.ingest.sources import SourceSpec


class HomeLayout:
    """The stage folders of one MTRAG_HOME (`self.home`)."""

    home: Path

    @property
    def raw_dir(self) -> Path:
        return self.home / "01-raw"

    @property
    def cas_dir(self) -> Path:
        return self.home / "02-cas"

    @property
    def graph_dir(self) -> Path:
        return self.home / "03-graph"

    @property
    def embeddings_dir(self) -> Path:
        return self.home / "04-embeddings"

    @property
    def qdrant_path(self) -> Path:
        return self.home / "05-qdrant"

    @property
    def fts_path(self) -> Path:
        return self.home / "06-fts" / "fts.sqlite"

    @property
    def links_dir(self) -> Path:
        return self.home / "07-links"

    @property
    def manifest_dir(self) -> Path:
        return self.home / "08-manifest"

    @property
    def sdist_dir(self) -> Path:
        return self.home / "sdists"

    @property
    def neo4j_dir(self) -> Path:
        return self.home / "neo4j"

    @property
    def postgres_dir(self) -> Path:
        """The local PostgreSQL `mtrag postgres start` runs (data/, logs/, run/)."""
        return self.home / "postgres"

    @property
    def shadows_dir(self) -> Path:
        """Shadow generations, one home each (`mtrag build --profile NAME`, docs/shadow.md)."""
        return self.home / "shadows"

    def shadow_home(self, profile: str) -> Path:
        return self.shadows_dir / profile

    @property
    def locks_dir(self) -> Path:
        return self.home / "locks"

    @property
    def links_table(self) -> Path:
        """The cross-source links of the last build (Parquet)."""
        return self.links_dir / "links.parquet"

    @property
    def links_state(self) -> Path:
        """What the last links stage resolved, per source and file (stages/links_state.py)."""
        return self.links_dir / "state.json"

    @property
    def proposals_log(self) -> Path:
        """Bridge proposals the serving side appends (JSON lines) and the links stage reads."""
        return self.links_dir / "proposals.jsonl"

    @property
    def qdrant_published_dir(self) -> Path:
        """Embedded mode: the read-only Qdrant copies readers open, one folder per generation."""
        return self.manifest_dir / "qdrant-published"

    @property
    def quality_refusal(self) -> Path:
        """Why the golden-query gate refused the last candidate generation (JSON; removed by the
        next publish); `mtrag status` shows it."""
        return self.manifest_dir / "quality-refused.json"

    def source_lock(self, source_id: str) -> Path:
        return self.locks_dir / f"{source_id}.lock"

    def dirty_marker(self, source_id: str | None = None) -> Path:
        """Exists while a source's build (or, without a source, the publish step) runs, and after
        one that failed: that work must not take the no-change shortcut."""
        return self.locks_dir / (f"{source_id}.dirty" if source_id else "publish.dirty")

    def stage_dirs(self) -> tuple[Path, ...]:
        return (self.raw_dir, self.cas_dir, self.graph_dir, self.embeddings_dir, self.links_dir,
                self.manifest_dir, self.fts_path.parent)

    def output_dirs(self) -> tuple[Path, ...]:
        """The home's folders mtrag writes (a user's own folder beside them, such as the demo's
        `data/samples`, is not one)."""
        return (*self.stage_dirs(), self.qdrant_path, self.sdist_dir, self.neo4j_dir, self.postgres_dir,
                self.locks_dir, self.shadows_dir, self.home / "dagster_home")


def current_path(manifest_dir: Path) -> Path:
    """The pointer file naming the published manifest."""
    return Path(manifest_dir) / "CURRENT"


def manifest_path(manifest_dir: Path, number: int) -> Path:
    return Path(manifest_dir) / f"manifest-{number}.json"


@dataclass(frozen=True)
class SourceLayout:
    """One source's files in the stage folders."""
    settings: "Settings"
    source_id: str

    @property
    def inventory(self) -> Path:
        return self.settings.raw_dir / self.source_id / "inventory.json"

    @property
    def tables(self) -> Path:
        return self.settings.cas_dir / "tables" / self.source_id

    @property
    def chunks(self) -> Path:
        """A bucketed table (stores/bucketed.py): a one-file change writes that file's bucket."""
        return self.tables / "chunks"

    @property
    def facts(self) -> Path:
        """The per-file parse facts index (path -> content hash, category, facts file)."""
        return self.tables / "facts-index.json"

    @property
    def facts_dir(self) -> Path:
        """One gzipped JSON per parsed file version: its graph facts (no chunk texts)."""
        return self.tables / "facts"

    @property
    def graph(self) -> Path:
        return self.settings.graph_dir / self.source_id

    @property
    def nodes(self) -> Path:
        """Bucketed by file (stores/bucketed.py), as `relations` (by evidence file) and `chunks`."""
        return self.graph / "nodes"

    @property
    def relations(self) -> Path:
        return self.graph / "relations"

    @property
    def references(self) -> Path:
        return self.graph / "references.parquet"

    @property
    def graph_inputs(self) -> Path:
        """What the graph tables were made from (stages/links_state.py): their digests, each file's
        facts key, whether the source feeds the links' symbol index."""
        return self.graph / "inputs.json"

    @property
    def imports(self) -> Path:
        """The source's import statements as (module_qn, imported, alias): the re-exports the link
        stage resolves doc references through, without decoding every file's facts."""
        return self.graph / "imports.parquet"

    @property
    def state(self) -> Path:
        """Small JSON with what each stage last produced (generation, digests) for this source."""
        return self.settings.raw_dir / self.source_id / "state.json"


def read_state(layout: SourceLayout) -> dict:
    try:
        return json.loads(layout.state.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def update_state(layout: SourceLayout, **values) -> None:
    from mtrag_resources.core.atomic import write_text_atomic
    state = read_state(layout)
    state.update(values)
    layout.state.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(layout.state, json.dumps(state, indent=1, sort_keys=True))


def spec_root(settings: "Settings", spec: "SourceSpec") -> Path:
    """Where a source's files are: its folder, or its unpacked sdist under `sdist_dir`."""
    return spec.root(settings.sdist_dir, settings.sources_file.parent)
