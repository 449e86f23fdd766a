"""Which files mtrag reads and how: suffix -> code language or document format."""
from __future__ import annotations

from pathlib import PurePosixPath

CODE_LANGUAGES = {
    ".py": "python", ".pyi": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".tsx": "tsx",
    ".java": "java", ".go": "go", ".rs": "rust",
}
DOC_FORMATS = {
    ".md": "markdown", ".markdown": "markdown", ".myst": "markdown",
    ".rst": "rst", ".html": "html", ".htm": "html", ".txt": "text",
    ".pdf": "pdf",  # binary: its text layer is read in docs sources only (ingest/pdf.py)
}


def classify(rel_path: str) -> tuple[str, str] | None:
    """('code', language) or ('doc', format), or None for a file mtrag does not index."""
    suffix = PurePosixPath(rel_path).suffix.lower()
    if suffix in CODE_LANGUAGES:
        return "code", CODE_LANGUAGES[suffix]
    if suffix in DOC_FORMATS:
        return "doc", DOC_FORMATS[suffix]
    return None
