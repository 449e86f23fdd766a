"""Content-addressed store: each text lives once, under blobs/<aa>/<bb>/<sha256>.

Writes go to a temporary file in the same folder and are renamed into place, so a reader (or a
crash) never sees half a blob, and two writers of the same content are harmless."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

URI_PREFIX = "cas://sha256/"


class ContentStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._blobs = os.fspath(self.root / "blobs")

    def path_for(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest[2:4] / digest

    @staticmethod
    def uri(digest: str) -> str:
        return URI_PREFIX + digest

    def put_bytes(self, data: bytes, digest: str | None = None) -> str:
        digest = digest or hashlib.sha256(data).hexdigest()
        target = self.path_for(digest)
        if target.exists():
            return digest
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest

    def put_text(self, text: str) -> str:
        return self.put_bytes(text.encode("utf-8"))

    def get_bytes(self, digest_or_uri: str) -> bytes:
        digest = digest_or_uri.removeprefix(URI_PREFIX)
        return self.path_for(digest).read_bytes()

    def get_text(self, digest_or_uri: str) -> str:
        return self.get_bytes(digest_or_uri).decode("utf-8", errors="replace")

    def digests(self) -> set[str]:
        """Every stored blob's digest (a writer's unfinished temporary files left out)."""
        if not os.path.isdir(self._blobs):
            return set()
        return {entry.name for top in os.scandir(self._blobs) if top.is_dir()
                for sub in os.scandir(top.path) if sub.is_dir()
                for entry in os.scandir(sub.path) if entry.is_file() and not entry.name.startswith(".tmp-")}

    def remove(self, digest: str) -> int:
        """Delete a blob; the bytes it held (0 when it was gone already)."""
        path = self.path_for(digest)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        return size

    def has(self, digest: str) -> bool:
        # a string path: the raw stage asks for every file of a source each batch, and a Path
        # built per file adds up
        return os.path.exists(f"{self._blobs}/{digest[:2]}/{digest[2:4]}/{digest}")
