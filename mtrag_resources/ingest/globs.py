"""Gitignore-like globs on relative POSIX paths: `*` and `?` stay inside one segment, `**` spans
segments (`**/` may match nothing). fnmatch lets `*` cross `/`, which makes `src/*.py` too greedy."""
from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=512)
def glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def matches_any(rel_path: str, patterns: tuple[str, ...] | list[str]) -> bool:
    return any(glob_regex(p).match(rel_path) for p in patterns)
