"""`import pandas` made to fail for a moment, for libraries that probe for pandas on import or first
use although mtrag never hands them pandas objects (the neo4j driver, pyarrow's conversions):
importing pandas is a noticeable cost to a process that needs none of it."""
from __future__ import annotations

import sys
from contextlib import contextmanager


class _Refuse:
    """A meta path finder that refuses pandas: `import pandas` raises ImportError, from Python
    and from compiled modules alike (a None entry in sys.modules is not honoured by Cython's
    imports)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is hidden while this library probes for it (core/pandas_hidden.py)")
        return None


@contextmanager
def pandas_hidden():
    """Within the block `import pandas` raises ImportError, unless pandas is loaded already (a
    process that loaded it keeps it visible). Afterwards pandas imports as usual."""
    if "pandas" in sys.modules:
        yield
        return
    finder = _Refuse()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
