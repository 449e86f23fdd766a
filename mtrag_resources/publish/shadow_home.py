"""A shadow's home (`<home>/shadows/NAME/`): a home of its own, so its stores, manifests, CURRENT
and Dagster instance are never the live ones, that reuses what the live home already paid for.

- `04-embeddings` and `sdists` are symbolic links to the live home's: the embedding cache is keyed
  by embedder fingerprint and content hash, so a shadow with the live embedder embeds nothing and
  one with another embedder adds its own fingerprint's shards beside the live ones.
- `01-raw`, `02-cas` and `03-graph` start as hard links of the live home's files at the shadow's
  first build: every writer replaces a file by renaming a new one over it, never in place, so the
  two homes then diverge file by file without touching each other's, and a sweep in one home
  unlinks only its own names. The live stores' projection snapshots (`projected/`) are left out:
  they describe the live stores, not the shadow's.
The layout and what a profile changes: docs/shadow.md."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.core.config import Settings

SHARED = ("embeddings_dir", "sdist_dir")        # linked to the live home's folders
SEEDED = ("cas_dir", "graph_dir", "raw_dir")    # hard-linked from the live home's at the first build;
                                                # raw last: its folder says the seeding finished
PROFILE_FILE = "profile.json"                   # the profile the shadow was last built with


def prepare(live: Settings, profile: dict) -> tuple[Path, dict]:
    """Make (or reuse) the shadow home of `profile` beside the live home's; returns it and what was
    seeded: {folder: files linked} on the first build, {} after."""
    shadow = Settings(home=live.shadow_home(profile["name"]))
    shadow.home.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        _link_folder(getattr(live, name), getattr(shadow, name))
    seeded = {}
    if not shadow.raw_dir.exists():
        for name in SEEDED:
            source, target = getattr(live, name), getattr(shadow, name)
            if target.exists():  # a seeding cut short: done again whole
                shutil.rmtree(target)
            if source.is_dir():
                seeded[target.name] = _hard_link_tree(source, target)
    write_text_atomic(shadow.home / PROFILE_FILE, json.dumps(profile, indent=1, sort_keys=True))
    return shadow.home, seeded


def built_profile(shadow_home: Path) -> dict | None:
    try:
        return json.loads((Path(shadow_home) / PROFILE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _link_folder(source: Path, link: Path) -> None:
    source.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and Path(os.readlink(link)) == source:
        return
    if link.is_symlink():
        link.unlink()
    elif link.exists():  # a folder a run without the link made: the shared one replaces it
        shutil.rmtree(link)
    link.symlink_to(source, target_is_directory=True)


def _hard_link_tree(source: Path, target: Path) -> int:
    """Hard links of `source`'s files under `target` (a copy where the file system refuses links),
    without projection snapshots and writers' temporary files; returns how many files."""
    count = 0

    def link(src: str, dst: str) -> None:
        nonlocal count
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        count += 1

    shutil.copytree(source, target, copy_function=link, symlinks=True,
                    ignore=lambda _dir, names: [n for n in names if n == "projected" or n.startswith(".tmp-")])
    return count
