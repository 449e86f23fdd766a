"""Class-data sharing for the local Neo4j server: its JVM maps an archive of Neo4j's classes already
parsed, verified and laid out instead of loading them from the jars, so Bolt answers sooner on less
CPU, which a build pays while it embeds (see docs/performance.md#neo4j).

The archive is made once per Java runtime, jar set and class list (any heap size maps it) by
`java -Xshare:dump`, from the class list shipped beside this module
(`data/neo4j-<version>.classlist.gz`: the classes a server loads to boot, take the demo's writes
and answer its queries; `scripts/neo4j_classlist.py` records it again for another Neo4j version).
The dump is slow, so the first launch without an archive starts it in a detached, niced process
and boots without it until the archive is complete (written beside its final name, then renamed).
A JVM that cannot map an archive boots without it (-Xshare:auto); a failed dump leaves
`<key>.failed` with its log. MTRAG_NEO4J_CDS=off: no archive made or used.
"""
from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mtrag_resources.core.config import env
from mtrag_resources.core.errors import ConfigError

CLASSLIST_DIR = Path(__file__).parent / "data"
# JDK 17's class list parser refuses longer lines (a lambda proxy's signature can be ~6k
# characters): `pack` leaves them out.
MAX_LINE = 4000


def enabled() -> bool:
    value = (env("MTRAG_NEO4J_CDS") or "on").strip().lower()
    if value not in ("on", "off"):
        raise ConfigError(f"MTRAG_NEO4J_CDS={value!r}: expected 'on' or 'off'")
    return value == "on"


def classlist_path(version: str) -> Path:
    return CLASSLIST_DIR / f"neo4j-{version}.classlist.gz"


def archive_key(java: str, lib: Path, classlist: Path) -> str:
    """What an archive is valid for: the Java runtime (its files), the jars (names, sizes, times:
    the JVM checks the class path against the archive's too) and the class list."""
    h = hashlib.sha256()
    real = Path(os.path.realpath(java))
    for f in (real, real.parent.parent / "release", *sorted(real.parent.parent.glob("lib/server/libjvm.so"))):
        try:
            st = f.stat()
            h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{f}:-\n".encode())
    for jar in sorted(lib.glob("*.jar")):
        st = jar.stat()
        h.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    h.update(hashlib.sha256(classlist.read_bytes()).digest())
    return h.hexdigest()[:24]


def cds_dir(lib: Path) -> Path:
    return lib.parent / "cds"


def archive_path(java: str, lib: Path, classlist: Path) -> Path:
    """Where the archive of this runtime, these jars and this class list is (or is to be) made;
    its `.lock`, `.log` and `.failed` files are beside it."""
    return cds_dir(lib) / f"{archive_key(java, lib, classlist)}.jsa"


def archive_flags(java: str, lib: Path, version: str) -> list[str]:
    """The flags that map this runtime's archive where it is made; else [] (and, unless one runs
    or failed for this key, a dump is started in the background for later launches)."""
    if not enabled():
        return []
    classlist = classlist_path(version)
    if not classlist.is_file():
        return []  # a Neo4j version no class list was recorded for
    archive = archive_path(java, lib, classlist)
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}"]
    if not archive.with_suffix(".failed").exists() and not _dump_running(archive.with_suffix(".lock")):
        start_dump(java, lib, classlist, archive)
    return []


def _dump_running(lock: Path) -> bool:
    try:
        with open(lock, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh, fcntl.LOCK_UN)
    except FileNotFoundError:
        return False
    except BlockingIOError:
        return True
    return False


def start_dump(java: str, lib: Path, classlist: Path, archive: Path) -> subprocess.Popen:
    """A detached process that makes `archive` (`main`'s `dump`): it outlives the launch."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    log = open(archive.with_suffix(".log"), "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "mtrag_resources.stores.neo4j_cds", "dump", "--java", java, "--lib", str(lib),
             "--classlist", str(classlist), "--archive", str(archive)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


def dump(java: str, lib: Path, classlist: Path, archive: Path, niceness: int = 10) -> int:
    """Make `archive` unless it exists or another process is making it; 0 when it is there after."""
    lock = archive.with_suffix(".lock")
    with open(lock, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # another dump of the same key runs
        if archive.is_file():
            return 0
        if niceness:
            os.nice(niceness)  # the launch that started it boots a server and a build embeds meanwhile
        for stale in archive.parent.glob(f"{archive.stem}.tmp*"):  # a killed dump's
            shutil.rmtree(stale, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix=f"{archive.stem}.tmp", dir=archive.parent) as tmp:
            plain = Path(tmp) / "classes.lst"
            plain.write_bytes(gzip.decompress(classlist.read_bytes()))
            partial = Path(tmp) / archive.name
            proc = subprocess.run([java, "-Xshare:dump", f"-XX:SharedClassListFile={plain}",
                                   f"-XX:SharedArchiveFile={partial}", "-XX:+UseG1GC",
                                   "-cp", f"{lib}/*"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
            if proc.returncode != 0 or not partial.is_file():
                tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
                archive.with_suffix(".failed").write_text(f"exit {proc.returncode}\n{tail}\n")
                print(f"class-data archive not made (exit {proc.returncode}):\n{tail}", flush=True)
                return 1
            os.replace(partial, archive)
        print(f"class-data archive made: {archive}", flush=True)
        return 0


def mapped_archive(pid: int) -> str | None:
    """The class-data archive the running JVM `pid` maps, if any: this module's, or the Java
    runtime's own default one (`lib/server/classes.jsa`) where it maps none of ours."""
    try:
        with open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                if line.rstrip().endswith(".jsa"):
                    return line.split(None, 5)[-1].strip()
    except OSError:
        return None
    return None


def pack(recorded: Path, out: Path) -> int:
    """A class list recorded by -XX:DumpLoadedClassList, as `dump` reads it: the lines JDK 17 parses
    (a truncated last line dropped), gzipped; the number of lines kept."""
    text = recorded.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()  # the JVM was stopped mid-line
    kept = [line for line in lines if len(line) < MAX_LINE]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.compress(("\n".join(kept) + "\n").encode(), mtime=0))
    return len(kept)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mtrag_resources.stores.neo4j_cds")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="make a class-data archive (what a launch starts in the background)")
    for name in ("java", "lib", "classlist", "archive"):
        d.add_argument(f"--{name}", required=True)
    p = sub.add_parser("pack", help="a recorded class list into the shipped form")
    p.add_argument("recorded")
    p.add_argument("out")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        return dump(args.java, Path(args.lib), Path(args.classlist), Path(args.archive))
    print(f"{pack(Path(args.recorded), Path(args.out))} lines -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
