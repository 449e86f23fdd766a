"""Hostile inputs of a size that used to cost gigabytes (issue #58): shared by
tests/test_hostile_sizes.py and bench/memory.py."""
from __future__ import annotations

import json


def alias_bomb(levels: int) -> str:
    """A flow sequence whose every anchor is nine aliases of the one before (billion laughs)."""
    parts = ["&a0 [" + ",".join(['"lol"'] * 9) + "]"]
    parts += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def minified_js(functions: int) -> str:
    """One line of `functions` small functions, as a bundler writes them."""
    return ";".join(f"function f{i}(a,b){{return a*{i}+b}}" for i in range(functions)) + "\n"


def github_issues(count: int) -> str:
    return json.dumps({"repository": "acme/shop", "issues": [
        {"number": n, "title": f"Checkout fails {n}", "body": f"Calling `tax()` fails, see #{max(1, n - 1)}.",
         "state": "open", "user": {"login": "ann"}, "created_at": f"2024-01-01T00:00:{n % 60:02d}Z",
         "updated_at": f"2024-{1 + n % 12:02d}-01T00:00:00Z", "html_url": f"https://github.com/acme/shop/issues/{n}"}
        for n in range(1, count + 1)]})
