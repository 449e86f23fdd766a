"""What an issue's key looks like: the forms an export gives (`#12`, `owner/repo#12`, `PROJ-12`),
checked where an export is read and where a query is recognised as naming one issue."""
from __future__ import annotations

import re

# An issue number is stored as a graph property, and Neo4j's integers are signed 64-bit.
MAX_ISSUE_NUMBER = 2**63 - 1
MAX_NUMBER_DIGITS = len(str(MAX_ISSUE_NUMBER))
REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
JIRA_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,49}-\d{1,9}$")


def number_of(digits: str) -> int | None:
    """`digits` as an issue number (ASCII digits, 1 to MAX_ISSUE_NUMBER), else None."""
    if not digits.isascii() or not digits.isdigit() or len(digits) > MAX_NUMBER_DIGITS:
        return None
    value = int(digits)
    return value if 1 <= value <= MAX_ISSUE_NUMBER else None


def is_issue_key(text: str) -> bool:
    """Is `text` an issue's key as an export gives it (`#12`, `owner/repo#12`, `PROJ-12`)?"""
    repo, sep, number = text.rpartition("#")
    if sep:
        return (not repo or bool(REPO_RE.match(repo))) and number_of(number) is not None
    return bool(JIRA_KEY_RE.match(text))
