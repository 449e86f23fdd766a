"""How the application room ends a command: what mtrag refuses on purpose is one clear line and
that error's exit code (2: bad input or configuration, 75: another build holds the source's lock,
1: anything else), an unforeseen failure one line too (its traceback with --debug), a full disk
named as such; argparse's refusals one line, exit 2. The CLI and the build server both end a
command here, so a build through the server says what one in a process would."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import traceback
from collections.abc import Callable

from mtrag_resources.core.config import Settings
from mtrag_resources.core.errors import MtragError


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusals as one line naming the input (and what is allowed), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {' '.join(message.split())} (see {self.prog} --help)\n")


def guarded(command: Callable[[], int], debug: bool) -> int:
    """`command`'s exit code, or the code and one line on stderr of what stopped it."""
    try:
        return command()
    except MtragError as exc:
        if debug:
            traceback.print_exc()
        print(f"mtrag: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # `mtrag status | head`: the reader left; say nothing more (and not at exit either)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("mtrag: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen failure: one line unless --debug
        if debug:
            raise
        full = full_disk()
        if full:  # SQLite says "disk I/O error" for what is a full disk: name the real cause
            print(f"mtrag: No space left on device: the disk holding {full} is full "
                  f"({type(exc).__name__}: {one_line(exc)[:300]})", file=sys.stderr)
            return 1
        print(f"mtrag: internal error: {type(exc).__name__}: {one_line(exc)} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1


def full_disk() -> str | None:
    """MTRAG_HOME's path when the filesystem holding it has (almost) no free space left."""
    home = Settings.from_env().home
    probe = next((p for p in (home, *home.parents) if p.exists()), None)
    try:
        return str(home) if probe is not None and shutil.disk_usage(probe).free < 1 << 20 else None
    except OSError:
        return None


def one_line(text) -> str:
    return " ".join(str(text).split())
