"""The one resource every asset uses: where MTRAG_HOME is, the sources, and the embedder."""
from __future__ import annotations

import dagster as dg

from mtrag_resources.core.config import Settings
from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig
from mtrag_resources.ingest.sources import SourceSpec, load_sources


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
