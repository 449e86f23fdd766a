"""Which models embed and translate a query: the default embedder that matches the published
generation's, the multilingual one for the CJK chunks' collections, and the Chinese-English
dictionary.

`QueryEmbedders` is one object the reader holds: it loads each model on first use, keeps it, and
refuses (EmbedderMismatch) an embedder that is not the one the generation was embedded with."""
from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
import time

from mtrag_resources.core.config import chosen, serving_environment
from mtrag_resources.core.errors import MtragError
from mtrag_resources.core.scripts import is_cjk_query
from mtrag_resources.embedding.multilingual import MultilingualEmbedder
from mtrag_resources.serving.translation import QueryTranslator, Translation

# The multilingual embedder's cost grows with the query's length (docs/performance.md#embedding);
# what an English question asks of the Chinese chunks is in its first words.
ML_QUERY_WORDS = 24
ML_QUERY_CJK_CHARS = 128
KEEP_EMBEDDERS = 2
EMBEDDER_VARIABLES = (("model", "MTRAG_EMBED_MODEL"), ("device", "MTRAG_EMBED_DEVICE"),
                      ("backend", "MTRAG_EMBED_BACKEND"))


class EmbedderMismatch(MtragError, RuntimeError):
    """The query embedder is not the one the published generation was embedded with."""

    http_status = 409


def multilingual_query_text(text: str) -> str:
    """The part of a query the multilingual channel embeds: a Chinese one's first
    ML_QUERY_CJK_CHARS characters, another's first ML_QUERY_WORDS words."""
    if is_cjk_query(text):
        return text[:ML_QUERY_CJK_CHARS]
    return " ".join(text.split()[:ML_QUERY_WORDS])


def ms_since(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 2)


class QueryEmbedders:
    """The query-side models, each loaded on first use."""

    def __init__(self):
        self._lock = threading.Lock()
        # (model, device, backend) -> its embedder, the latest used last: the generation served and
        # the one before it, so a cut-over and its rollback each find theirs loaded
        self._embedders: OrderedDict = OrderedDict()
        self._multilingual = None
        self.translator = QueryTranslator()        # a Chinese question's English words (loaded on first use)

    def embed(self, text: str, manifest: dict):
        """(the query's vector by the embedder `manifest` names, its milliseconds)."""
        t0 = time.perf_counter()
        return self.embedder_for(manifest).encode([text])[0], ms_since(t0)

    def embed_multilingual(self, text: str):
        """(the query's vector in the multilingual space, its milliseconds)."""
        t0 = time.perf_counter()
        return self._multilingual.encode_query(multilingual_query_text(text)), ms_since(t0)

    def multilingual_channel(self, manifest: dict) -> tuple[bool, list[dict]]:
        """Does the query also search the multilingual collections (the CJK chunks, embedded by
        the multilingual model)? Yes when the generation has them and the query-side multilingual
        embedder is the one that embedded them, whatever the question's language: an English
        question finds a Chinese doc there. A mismatch is reported stale."""
        published = manifest.get("multilingual")
        if not published:
            return False, []
        if self._multilingual is None:
            self._multilingual = MultilingualEmbedder(threads=2)
        if self._multilingual.fingerprint_id != published.get("fingerprint_id"):
            return False, [{"source": "*", "store": "qdrant_ml",
                            "reason": f"the query's multilingual embedder {self._multilingual.fingerprint_id} is not "
                                      f"the generation's {published.get('fingerprint_id')}"}]
        return True, []

    def translate(self, text: str) -> Translation:
        """The English words of a question written (mostly) in Chinese; no translation otherwise:
        an English question with a Chinese word keeps its own words."""
        return self.translator.translate(text) if is_cjk_query(text) else Translation("", ())

    def preload(self, manifest: dict) -> None:
        """Load the query embedder for `manifest` on the side pool while the first generation's
        stores open (a one-shot `mtrag query` otherwise loads it after them). A failure here is
        the first query's to report, so it is not raised."""
        with contextlib.suppress(Exception):
            self.embedder_for(manifest).model  # noqa: B018 - loads the model files

    def prepare(self, manifest: dict) -> None:
        """Before a switch to `manifest`'s generation: its query embedder loaded and run once where
        it is another than the ones loaded (a cut-over's), so the first question after the swap
        does not wait for the model. A switch to a generation of a loaded embedder costs nothing."""
        with contextlib.suppress(Exception):
            if _key(self._config(manifest)) not in self._embedders:
                self.embedder_for(manifest).encode(["warm"])

    def _config(self, manifest: dict):
        """The query embedder's configuration for `manifest`'s generation: this process's
        MTRAG_EMBED_* where set, else what the manifest serves (a cut-over profile's), else the defaults."""
        from mtrag_resources.embedding.embedder import DEFAULT_MODEL, EmbedderConfig
        served = serving_environment(manifest)
        settings = {key: chosen(variable) or served.get(variable) or None for key, variable in EMBEDDER_VARIABLES}
        # one thread per query: requests run in parallel threads, and one short text
        # gains nothing from splitting (docs/performance.md#serving)
        config = EmbedderConfig.from_env(threads=1, model=settings["model"] or DEFAULT_MODEL,
                                         device=settings["device"] or "cpu", backend=settings["backend"] or "")
        if not settings["backend"] and config.device.startswith("cpu"):
            # unset: embed queries the way the published generation embedded its chunks
            config.backend = "onnx-int8" if _with_vector_kind(manifest["embedder"])["vectors"] != "fp32" else "onnx"
        return config

    def embedder_for(self, manifest: dict):
        """The query embedder of `manifest`'s generation (`_config`), refused where it is not the
        one the generation was embedded with."""
        from mtrag_resources.embedding.embedder import Embedder
        expected = manifest["embedder"]
        config = self._config(manifest)
        key = _key(config)
        with self._lock:
            embedder = self._embedders.get(key)
            if embedder is None:
                embedder = self._embedders[key] = Embedder(config)
                while len(self._embedders) > KEEP_EMBEDDERS:
                    self._embedders.popitem(last=False)
            self._embedders.move_to_end(key)
        fp = embedder.fingerprint  # cached: what the loaded model is (not its files' state, read again per query)
        keys = ("model_id", "dim", "max_seq_length", "normalize", "prompt", "vectors")
        fp, expected = _with_vector_kind(fp), _with_vector_kind(expected)
        diff = {k: (fp.get(k), expected.get(k)) for k in keys if fp.get(k) != expected.get(k)}
        if diff:
            raise EmbedderMismatch(
                "the query embedder does not match the published generation's embedder: "
                + ", ".join(f"{k}: query {a!r} vs manifest {b!r}" for k, (a, b) in diff.items())
                + " (set MTRAG_EMBED_MODEL to the manifest's model or rebuild)")
        return embedder


def _key(config) -> tuple:
    return config.model, config.device, config.backend


def _with_vector_kind(fp: dict) -> dict:
    """torch and onnx (fp32) give the same vectors (to ~3e-7): a query may use either against an
    index built by the other; int8 vectors are another kind."""
    backend = fp.get("backend") or "torch"
    return {**fp, "vectors": backend if backend.startswith("onnx-int8") else "fp32"}
