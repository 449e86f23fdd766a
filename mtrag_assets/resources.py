"""The one resource every asset uses: where MTRAG_HOME is, the sources, and the embedder."""
from __future__ import annotations

import dagster as dg
from pydantic import PrivateAttr

from mtrag_resources.core.config import Settings
from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig
from mtrag_resources.ingest.sources import SourceSpec, load_sources
from mtrag_resources.serving.fusion import DEFAULT_WEIGHTS
from mtrag_resources.serving.reader import IndexReader


_EMBEDDERS: dict[tuple, Embedder] = {}


def _embedder(config: EmbedderConfig) -> Embedder:
    # One model per process: the in-process executor of `mtrag build` reuses it across stages.
    key = tuple(sorted(config.__dict__.items()))
    if key not in _EMBEDDERS:
        _EMBEDDERS[key] = Embedder(config)
    return _EMBEDDERS[key]


class MtragResource(dg.ConfigurableResource):
    """Settings for a build. Empty strings fall back to the environment (MTRAG_HOME,
    MTRAG_EMBED_MODEL, MTRAG_EMBED_DEVICE), so the UI and the CLI agree by default."""

    embed_model: str = ""
    embed_device: str = ""

    def settings(self) -> Settings:
        return Settings.from_env().ensure()

    def specs(self) -> list[SourceSpec]:
        return load_sources(self.settings().sources_file)

    def spec(self, source_id: str) -> SourceSpec:
        for spec in self.specs():
            if spec.id == source_id:
                return spec
        raise dg.Failure(f"source {source_id!r} is not in {self.settings().sources_file}")

    def embedder(self) -> Embedder:
        config = EmbedderConfig.from_env()
        if self.embed_model:
            config = EmbedderConfig(**{**config.__dict__, "model": self.embed_model})
        if self.embed_device:
            config = EmbedderConfig(**{**config.__dict__, "device": self.embed_device})
        return _embedder(config)


class IndexReaderResource(dg.ConfigurableResource):
    """The serving reader as a Dagster resource, for assets and sensors that query the published
    generation (`IndexReader` itself is a plain class, so the CLI and HTTP never load Dagster)."""

    home: str = ""
    weight_dense: float = DEFAULT_WEIGHTS["dense"]
    weight_fts: float = DEFAULT_WEIGHTS["fts"]
    weight_exact: float = DEFAULT_WEIGHTS["exact"]
    max_hops_limit: int = 6
    log_proposals: bool = True

    _reader: IndexReader | None = PrivateAttr(default=None)

    def reader(self) -> IndexReader:
        if self._reader is None:
            self._reader = IndexReader(self.home, self.weight_dense, self.weight_fts, self.weight_exact,
                                       self.max_hops_limit, self.log_proposals)
        return self._reader

    def teardown_after_execution(self, context) -> None:
        if self._reader is not None:
            self._reader.close()
