"""Issue-tracker exports (`{id, kind: issues, path: FILE}`): a GitHub REST or a Jira JSON export
read into issues and their comments, and chunked for the stages. Pure: bytes or text in, records
out; no file, no store.

Formats (`parse_export` tells them apart by their shape; anything else is an IssueExportError):

* **GitHub**: the objects `GET /repos/{owner}/{repo}/issues` returns (`number`, `title`, `body`,
  `state`, `labels[].name`, `user.login`, `created_at`, `updated_at`, `closed_at`, `html_url`; a
  `pull_request` key marks a pull request) and, optionally, the comments
  `GET /repos/{owner}/{repo}/issues/comments` returns (`issue_url` or an explicit `issue_number`,
  `body`, `user.login`, `created_at`, `html_url`, `id`). Either a bare array of issues, or the
  container `{"repository": "owner/repo", "issues": [...], "comments": [...]}` (both keys besides
  `issues` optional; without `repository` it is read from the issues' `html_url` /
  `repository_url`). An issue's `comments` may also be the list of its comments.
* **Jira**: the search/export JSON, `{"issues": [{"key", "fields": {...}}]}` (or a bare array of
  such issues): `fields.summary`, `fields.description` (wiki markup, Markdown, or Atlassian
  Document Format), `fields.status.name`, `fields.labels`, `fields.reporter.displayName`,
  `fields.created`, `fields.updated`, `fields.resolutiondate`, `fields.issuetype.name`,
  `fields.comment.comments[].body / author.displayName / created / id`.

Untrusted input, checked as it is read: an issue number is a whole number from 1 to 2**63 - 1 (a
graph property; a longer digit string is never converted), a lone surrogate escape (`\ud800`)
becomes U+FFFD, and two items with one key are one issue listed twice (the same id, else the same
creation time: the later update is kept) or the export is refused naming both places.

An issue's key is `owner/repo#12` (GitHub, repository known), `#12` (repository unknown) or
`PROJ-12` (Jira); its chunks (`chunk_issue_export`): one parent per issue (title, state, labels,
dates, the head of the body) and children for its body and each comment, long ones cut into
passages as docs are (`chunking/docs.chunk_doc`: heading-aware, at most `max_tokens`). Every chunk
carries `symbol` = the key, `issue_key` and `state`. The graph: an `Issue` node per issue (key,
number, title, state, labels, author, dates, url, is_pull_request in `properties`) that CONTAINS
its child chunks, and REFERENCES between issues (`#12`, `owner/repo#12`, an issue URL, `PROJ-12`
in a body or comment) when the target is in the export (VERIFIED, with the line as evidence).
Code the texts name (roles, `code spans`, file paths) become DocReferences, resolved across sources
into MENTIONS by the same linker as docs' (ingest/doc_links.py)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from mtrag_resources.core.models import Chunk, DocReference, GraphNode, GraphRelation, ParsedFile, stable_id
from mtrag_resources.core.unicode_text import may_hold_surrogates, without_lone_surrogates
from mtrag_resources.ingest.chunking.docs import chunk_doc
from mtrag_resources.ingest.chunking.limits import DEFAULT_MAX_ISSUES, cut_warning
from mtrag_resources.ingest.chunking.tokens import sentence_spans
from mtrag_resources.ingest.filetypes import CODE_LANGUAGES
from mtrag_resources.ingest.issue_keys import JIRA_KEY_RE, MAX_ISSUE_NUMBER, MAX_NUMBER_DIGITS, REPO_RE, number_of

FORMATS = ("github", "jira")
SOURCE_KIND = "issues"
# The body head a parent shows beside the title and state (the children hold all of it).
PARENT_BODY_CHARS = 2000
SUMMARY_MAX_CHARS = 300
NOT_AN_EXPORT = "not a GitHub or Jira export"
_HTML_ISSUE_URL_RE = re.compile(r"^https?://[^/\s]+/(?P<repo>[^/\s]+/[^/\s]+)/(?:issues|pull)/(?P<num>\d+)")
_API_REPO_URL_RE = re.compile(r"/repos/(?P<repo>[^/\s]+/[^/\s]+?)/?$")
_API_ISSUE_URL_RE = re.compile(r"/repos/(?P<repo>[^/\s]+/[^/\s]+)/issues/(?P<num>\d+)/?$")

# References between issues, in prose (fenced code is masked first).
_GH_REF_RE = re.compile(r"(?<![\w/&#.-])(?:(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+))?#(?P<num>\d{1,9})\b")
_GH_URL_RE = re.compile(r"https?://[^\s/]+/(?P<repo>[\w.-]+/[\w.-]+)/(?:issues|pull)/(?P<num>\d{1,9})\b")
_JIRA_REF_RE = re.compile(r"(?<![\w-])(?P<key>[A-Z][A-Z0-9_]{1,49}-\d{1,9})(?![\w-])")
_FENCED_RE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)
# File paths the texts name: in backticks, or bare with at least one folder, ending in a code suffix.
_SUFFIX_ALT = "|".join(sorted((s[1:] for s in CODE_LANGUAGES), key=len, reverse=True))
_PATH = rf"[\w.-]*[\w-]\.(?:{_SUFFIX_ALT})"
_TICK_PATH_RE = re.compile(rf"`(?P<path>(?:[\w.-]+/)*{_PATH})`")
_BARE_PATH_RE = re.compile(rf"(?<![\w/.`-])(?P<path>(?:[\w.-]+/)+{_PATH})(?![\w/`-])")
# Jira wiki markup: {code}/{noformat} blocks, {{monospace}}.
_JIRA_BLOCK_RE = re.compile(r"\{(code|noformat)(?::[^}\n]*)?\}(.*?)\{\1\}", re.S)
_JIRA_MONO_RE = re.compile(r"\{\{([^{}\n]+?)\}\}")


class IssueExportError(ValueError):
    """The file is not a readable GitHub or Jira export; the message (one line) says why."""


class _LongNumber:
    """A JSON integer of more digits than any issue number has, kept as its digit count: int() of
    one past 4,300 digits raises, and no field mtrag reads can hold one."""

    def __init__(self, digits: str):
        self.shown = digits if len(digits) <= 40 else f"a number of {len(digits.lstrip('-'))} digits"

    def __repr__(self) -> str:
        return self.shown


def _json_int(digits: str):
    return int(digits) if len(digits.lstrip("-")) <= MAX_NUMBER_DIGITS else _LongNumber(digits)


def _issue_number(value) -> int | None:
    """`value` as an issue number (1 to MAX_ISSUE_NUMBER: a JSON integer, or a string of digits),
    else None."""
    if isinstance(value, str):
        return number_of(value.strip().lstrip("#"))
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= MAX_ISSUE_NUMBER else None


@dataclass
class Comment:
    comment_id: str   # the tracker's id, else its place among the issue's comments ("3")
    author: str
    created_at: str
    body: str
    url: str = ""


@dataclass
class Issue:
    key: str          # owner/repo#12 | #12 | PROJ-12
    display: str      # #12 | PROJ-12: how a reader writes it
    number: int
    title: str
    body: str
    state: str        # GitHub: open | closed; Jira: the status name (To Do, In Progress, Done, ...)
    labels: list[str]
    author: str
    created_at: str
    updated_at: str
    closed_at: str
    url: str
    is_pull_request: bool
    repository: str   # owner/repo (GitHub), the project key (Jira), "" when unknown
    issue_type: str = ""  # Jira: Bug, Story, ...; GitHub: "pull request" or "issue"
    comments: list[Comment] = field(default_factory=list)


@dataclass
class IssueExport:
    format: str       # github | jira
    repository: str   # the export's repository (GitHub) or its projects (Jira, comma separated)
    issues: list[Issue]
    warnings: list[str] = field(default_factory=list)
    comments: int = 0


# ----------------------------------------------------------------------------- parsing

def parse_export(data: bytes | str) -> IssueExport:
    """The export in `data` (the file's bytes, or its text), or IssueExportError saying why not:
    not UTF-8, not JSON, or not the shape of a GitHub or Jira export."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise IssueExportError(f"not UTF-8 text (byte {exc.start}): {exc.reason}") from None
    else:
        text = data
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise IssueExportError(f"{NOT_AN_EXPORT}: the file is empty")
    try:
        doc = json.loads(text, parse_int=_json_int)
        if may_hold_surrogates(text):  # a lone `\ud800` encodes nowhere: U+FFFD instead
            doc = without_lone_surrogates(doc)
    except json.JSONDecodeError as exc:
        raise IssueExportError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise IssueExportError("not valid JSON: nested too deeply") from None
    items, container = _issue_items(doc)
    fmt = detect_format(items, container)
    export = _github_export(items, container) if fmt == "github" else _jira_export(items)
    export.issues.sort(key=lambda i: (i.repository.lower(), i.number, i.key))
    export.comments = sum(len(i.comments) for i in export.issues)
    return export


def check_export(data: bytes | str) -> str | None:
    """Why `data` is not a usable export (one line), or None."""
    try:
        parse_export(data)
    except IssueExportError as exc:
        return str(exc)
    return None


def _describe(value) -> str:
    """What a JSON value is, for an error message (keys are cut short: the file is untrusted)."""
    if isinstance(value, dict):
        if not value:
            return "an empty object"
        keys = [k[:40] for k in list(value)[:8]]
        return f"an object with keys {keys}" + (f" and {len(value) - 8} more" if len(value) > 8 else "")
    if isinstance(value, list):
        if not value:
            return "an empty array"
        first = value[0]
        return "an array of " + ("objects" if isinstance(first, dict) else "arrays" if isinstance(first, list)
                                 else {str: "strings", bool: "booleans"}.get(type(first), "numbers" if first is not None else "nulls"))
    if value is None:
        return "null"
    return {str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _issue_items(doc) -> tuple[list, dict]:
    if isinstance(doc, list):
        return doc, {}
    if isinstance(doc, dict) and isinstance(doc.get("issues"), list):
        return doc["issues"], doc
    raise IssueExportError(f"{NOT_AN_EXPORT}: expected an array of issues or an object with an \"issues\" "
                           f"array, found {_describe(doc)}")


def _is_github(item) -> bool:
    return isinstance(item, dict) and "number" in item and "title" in item


def _is_jira(item) -> bool:
    return isinstance(item, dict) and "key" in item and isinstance(item.get("fields"), dict)


def detect_format(items: list, container: dict | None = None) -> str:
    """`github` or `jira`, by the first issue's shape (every other must have the same one); an
    empty export is GitHub's unless it says otherwise."""
    if not items:
        return "jira" if container and ("startAt" in container or "maxResults" in container) else "github"
    first = items[0]
    fmt = "github" if _is_github(first) else "jira" if _is_jira(first) else None
    for i, item in enumerate(items):
        if fmt is None or not (_is_github(item) if fmt == "github" else _is_jira(item)):
            what = ("GitHub's \"number\" and \"title\"" if fmt == "github" else "Jira's \"key\" and \"fields\""
                    if fmt == "jira" else "GitHub's \"number\" and \"title\" nor Jira's \"key\" and \"fields\"")
            lead = "has neither " if fmt is None else "lacks "
            raise IssueExportError(f"{NOT_AN_EXPORT}: issues[{i}] {lead}{what} (it is {_describe(item)})")
    return fmt


def _str(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return ""


def _text(value) -> str:
    return _str(value).replace("\r\n", "\n").replace("\r", "\n")


def _login(user) -> str:
    if isinstance(user, dict):
        return _str(user.get("login") or user.get("name"))
    return _str(user)


def _labels(value) -> list[str]:
    out = []
    for label in value if isinstance(value, list) else []:
        name = _str(label.get("name")) if isinstance(label, dict) else _str(label)
        if name and name not in out:
            out.append(name)
    return out


def _repo_name(value) -> str:
    if isinstance(value, dict):
        value = value.get("full_name") or (f"{_login(value.get('owner'))}/{_str(value.get('name'))}"
                                           if value.get("owner") and value.get("name") else "")
    value = _str(value).strip()
    return value if REPO_RE.match(value) else ""


def _repo_of(item: dict) -> str:
    m = _HTML_ISSUE_URL_RE.match(_str(item.get("html_url")))
    if m:
        return m.group("repo")
    m = _API_REPO_URL_RE.search(_str(item.get("repository_url")))
    return m.group("repo") if m else ""


def _gh_key(repo: str, number: int) -> str:
    return f"{repo}#{number}" if repo else f"#{number}"


def _github_export(items: list, container: dict) -> IssueExport:
    repository = _repo_name(container.get("repository"))
    if container.get("repository") is not None and not repository:
        raise IssueExportError(f"{NOT_AN_EXPORT}: \"repository\" must be \"owner/repo\", "
                               f"got {_short(container.get('repository'))}")
    issues: dict[str, Issue] = {}
    warnings: list[str] = []
    embedded: dict[str, list] = {}
    where: dict[str, int] = {}  # an issue's key -> its place among the items
    for i, item in enumerate(items):
        number = item.get("number")
        if isinstance(number, str) or _issue_number(number) is None:
            raise IssueExportError(f"{NOT_AN_EXPORT}: issues[{i}]: \"number\" must be a whole number from 1 to "
                                   f"{MAX_ISSUE_NUMBER}, got {_short(number)}")
        if not isinstance(item.get("title"), str):
            raise IssueExportError(f"{NOT_AN_EXPORT}: issues[{i}] (#{number}): \"title\" must be a string, "
                                   f"got {_short(item.get('title'))}")
        repo = repository or _repo_of(item)
        is_pr = "pull_request" in item
        issue = Issue(
            key=_gh_key(repo, number), display=f"#{number}", number=number, title=item["title"].strip(),
            body=_text(item.get("body")), state=_str(item.get("state")).strip().lower() or "open",
            labels=_labels(item.get("labels")), author=_login(item.get("user")),
            created_at=_str(item.get("created_at")), updated_at=_str(item.get("updated_at")),
            closed_at=_str(item.get("closed_at")), url=_str(item.get("html_url")), is_pull_request=is_pr,
            repository=repo, issue_type="pull request" if is_pr else "issue")
        old = issues.get(issue.key.lower())
        if old is not None:  # overlapping pages of a paginated export: keep the later update
            _check_same_issue(items, where[issue.key.lower()], i, issue.key, _github_identity)
            warnings.append(f"{issue.key} appears more than once; kept the one updated last")
            if old.updated_at > issue.updated_at:
                continue
        issues[issue.key.lower()] = issue
        where[issue.key.lower()] = i
        if isinstance(item.get("comments"), list):
            embedded[issue.key.lower()] = item["comments"]
    comments = container.get("comments")
    if comments is not None and not isinstance(comments, list):
        raise IssueExportError(f"{NOT_AN_EXPORT}: \"comments\" must be an array, found {_describe(comments)}")
    unknown = 0
    attached: list[tuple[str, int, dict]] = []
    for j, c in enumerate(comments or []):
        if not isinstance(c, dict):
            raise IssueExportError(f"{NOT_AN_EXPORT}: comments[{j}] is {_describe(c)}, not a comment object")
        repo, number = _comment_issue(c, repository, j)
        if number is None:
            raise IssueExportError(f"{NOT_AN_EXPORT}: comments[{j}] names no issue (give \"issue_url\" or "
                                   f"\"issue_number\")")
        key = _gh_key(repo, number).lower()
        if key not in issues and not repo and len({i.repository for i in issues.values()}) == 1:
            key = _gh_key(next(iter(issues.values())).repository, number).lower()
        if key not in issues:
            unknown += 1
            continue
        attached.append((key, j, c))
    for key, listed in embedded.items():
        attached.extend((key, -1, c) for c in listed if isinstance(c, dict))
    for key, _j, c in attached:
        issue = issues[key]
        cid = _str(c.get("id")) or str(len(issue.comments) + 1)
        issue.comments.append(Comment(cid, _login(c.get("user")), _str(c.get("created_at")),
                                      _text(c.get("body")), _str(c.get("html_url"))))
    for issue in issues.values():
        issue.comments.sort(key=lambda c: (c.created_at, c.comment_id.zfill(20)))
        _dedupe_comments(issue)
    if unknown:
        warnings.append(f"{unknown} comments are about issues the export does not hold; left out")
    repos = sorted({i.repository for i in issues.values() if i.repository})
    return IssueExport("github", repository or ", ".join(repos), list(issues.values()), warnings)


def _dedupe_comments(issue: Issue) -> None:
    seen: set[str] = set()
    kept = []
    for c in issue.comments:
        if c.comment_id in seen:
            continue
        seen.add(c.comment_id)
        kept.append(c)
    issue.comments = kept


def _comment_issue(c: dict, repository: str, j: int) -> tuple[str, int | None]:
    """The (repository, number) of the issue comment `c` (comments[j]) is about; number None when
    it names none, IssueExportError when the number it names cannot be an issue's."""
    for key in ("issue_number", "issue"):
        v = c.get(key)
        if isinstance(v, str) and v.strip().lstrip("#").isdigit() or isinstance(v, (int, _LongNumber)) \
                and not isinstance(v, bool):
            return repository, _comment_number(v, j, key)
    url = _str(c.get("issue_url"))
    m = _API_ISSUE_URL_RE.search(url) or _HTML_ISSUE_URL_RE.match(url)
    if m:
        return repository or m.group("repo"), _comment_number(m.group("num"), j, "issue_url")
    m = _HTML_ISSUE_URL_RE.match(_str(c.get("html_url")))
    if m:
        return repository or m.group("repo"), _comment_number(m.group("num"), j, "html_url")
    return repository, None


def _comment_number(value, j: int, key: str) -> int:
    number = _issue_number(value)
    if number is None:
        shown = f"a number of {len(value)} digits" if isinstance(value, str) and len(value) > 24 else _short(value)
        raise IssueExportError(f"{NOT_AN_EXPORT}: comments[{j}]: \"{key}\": {shown} is no issue number (a whole "
                               f"number from 1 to {MAX_ISSUE_NUMBER})")
    return number


def _github_identity(item: dict) -> str:
    """What tells one GitHub issue from another of the same number: its id, else its creation."""
    return _str(item.get("id")) or _str(item.get("node_id")) or _str(item.get("created_at"))


def _jira_identity(item: dict) -> str:
    fields = item.get("fields") if isinstance(item.get("fields"), dict) else {}
    return _str(item.get("id")) or _str(fields.get("created"))


def _check_same_issue(items: list, first: int, then: int, key: str, identity) -> None:
    """Two items with one key are one issue listed twice (overlapping pages of a paginated export:
    the later update is kept) only when their id, else their creation time, is the same; any other
    pair is refused, since keeping one would drop the other issue unseen."""
    a, b = identity(items[first]), identity(items[then])
    if a and a == b:
        return
    why = f"different ids or creation times ({_short(a)} and {_short(b)})" if a or b \
        else "neither has an id or creation time that shows them to be one issue"
    raise IssueExportError(f"{NOT_AN_EXPORT}: issues[{first}] and issues[{then}] are both {key}: {why}; an export "
                           "lists each issue once")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _person(value) -> str:
    if isinstance(value, dict):
        return _str(value.get("displayName") or value.get("name") or value.get("emailAddress"))
    return _str(value)


def _jira_export(items: list) -> IssueExport:
    issues: dict[str, Issue] = {}
    where: dict[str, int] = {}  # an issue's key -> its place among the items
    warnings: list[str] = []
    for i, item in enumerate(items):
        key = _str(item.get("key")).strip()
        if not JIRA_KEY_RE.match(key):
            raise IssueExportError(f"{NOT_AN_EXPORT}: issues[{i}]: \"key\" must be a Jira key like \"PROJ-12\", "
                                   f"got {_short(item.get('key'))}")
        f = item["fields"]
        status = f.get("status")
        state = _str(status.get("name")) if isinstance(status, dict) else _str(status)
        issue_type = f.get("issuetype")
        base = _str(item.get("self")).split("/rest/api/", 1)[0] if "/rest/api/" in _str(item.get("self")) else ""
        issue = Issue(
            key=key, display=key, number=int(key.rsplit("-", 1)[1]), title=_str(f.get("summary")).strip(),
            body=jira_text(f.get("description")), state=state.strip() or "Open", labels=_labels(f.get("labels")),
            author=_person(f.get("reporter") or f.get("creator")), created_at=_str(f.get("created")),
            updated_at=_str(f.get("updated")), closed_at=_str(f.get("resolutiondate")),
            url=f"{base}/browse/{key}" if base else "", is_pull_request=False,
            repository=key.rsplit("-", 1)[0],
            issue_type=_str(issue_type.get("name")) if isinstance(issue_type, dict) else _str(issue_type))
        block = f.get("comment")
        listed = block.get("comments") if isinstance(block, dict) else block if isinstance(block, list) else []
        for j, c in enumerate(listed or []):
            if not isinstance(c, dict):
                raise IssueExportError(f"{NOT_AN_EXPORT}: issues[{i}] ({key}): comment {j} is {_describe(c)}")
            issue.comments.append(Comment(_str(c.get("id")) or str(j + 1), _person(c.get("author")),
                                          _str(c.get("created")), jira_text(c.get("body")),
                                          f"{base}/browse/{key}?focusedCommentId={_str(c.get('id'))}"
                                          if base and c.get("id") else ""))
        _dedupe_comments(issue)
        if key in issues:
            _check_same_issue(items, where[key], i, key, _jira_identity)
            warnings.append(f"{key} appears more than once; kept the one updated last")
            if issues[key].updated_at > issue.updated_at:
                continue
        issues[key] = issue
        where[key] = i
    projects = sorted({i.repository for i in issues.values()})
    return IssueExport("jira", ", ".join(projects), list(issues.values()), warnings)


def jira_text(value) -> str:
    """A Jira description or comment body as Markdown-like text: wiki markup's `{code}` /
    `{noformat}` blocks become fenced blocks and `{{monospace}}` code spans; an Atlassian Document
    Format document (API v3) becomes paragraphs, headings, lists and fenced code."""
    if isinstance(value, dict):
        return _adf(value, 0).strip("\n")
    text = _text(value)
    out, pos = [], 0
    for m in _JIRA_BLOCK_RE.finditer(text):
        out.append(_JIRA_MONO_RE.sub(r"`\1`", text[pos:m.start()]))
        out.append("\n```\n" + m.group(2).strip("\n") + "\n```\n")
        pos = m.end()
    out.append(_JIRA_MONO_RE.sub(r"`\1`", text[pos:]))
    return "".join(out)


def _adf(node, depth: int) -> str:
    if not isinstance(node, dict) or depth > 60:
        return ""
    kind = node.get("type")
    attrs = node.get("attrs") if isinstance(node.get("attrs"), dict) else {}
    if kind == "text":
        text = _str(node.get("text"))
        marks = node.get("marks") if isinstance(node.get("marks"), list) else []
        return f"`{text}`" if any(isinstance(m, dict) and m.get("type") == "code" for m in marks) else text
    if kind == "hardBreak":
        return "\n"
    if kind == "mention":
        return "@" + _str(attrs.get("text")).lstrip("@")
    if kind in ("inlineCard", "blockCard", "embedCard"):
        return _str(attrs.get("url"))
    if kind == "emoji":
        return _str(attrs.get("text") or attrs.get("shortName"))
    content = node.get("content") if isinstance(node.get("content"), list) else []
    inner = "".join(_adf(c, depth + 1) for c in content)
    if kind == "paragraph":
        return inner + "\n\n"
    if kind == "heading":
        level = attrs.get("level") if isinstance(attrs.get("level"), int) else 2
        return "#" * max(1, min(6, level)) + " " + inner.strip() + "\n\n"
    if kind == "codeBlock":
        return "```\n" + inner.strip("\n") + "\n```\n\n"
    if kind == "listItem":
        return "- " + inner.strip().replace("\n\n", "\n") + "\n"
    if kind in ("bulletList", "orderedList"):
        return inner + "\n"
    if kind == "blockquote":
        return "".join(f"> {line}\n" for line in inner.strip().split("\n")) + "\n"
    if kind == "rule":
        return "---\n\n"
    return inner


# ----------------------------------------------------------------------------- chunking

def issue_node_id(source_id: str, key: str) -> str:
    return f"{source_id}:issue:{key}"


def _first_sentence(text: str) -> str:
    spans = sentence_spans(text)
    return " ".join(text[spans[0][0]:spans[0][1]].split())[:SUMMARY_MAX_CHARS] if spans else ""


def _header(issue: Issue) -> str:
    kind = "pull request" if issue.is_pull_request else (issue.issue_type or "issue").lower()
    facts = [f"state: {issue.state}", kind]
    if issue.labels:
        facts.append("labels: " + ", ".join(issue.labels))
    if issue.author:
        facts.append(f"opened by {issue.author}" + (f" on {issue.created_at[:10]}" if issue.created_at else ""))
    elif issue.created_at:
        facts.append(f"opened {issue.created_at[:10]}")
    if issue.closed_at:
        facts.append(f"closed {issue.closed_at[:10]}")
    lines = [f"{issue.display} {issue.title}", " · ".join(facts)]
    if issue.url:
        lines.append(issue.url)
    return "\n".join(lines)


def _body_head(body: str) -> str:
    if len(body) <= PARENT_BODY_CHARS:
        return body
    cut = body.rfind("\n", 0, PARENT_BODY_CHARS)
    return body[:cut if cut > PARENT_BODY_CHARS // 2 else PARENT_BODY_CHARS].rstrip() + "\n..."


def _line_count(text: str) -> int:
    return max(1, text.count("\n") + 1) if text else 1


def _passages(source_id: str, file_path: str, text: str, max_tokens: int) -> tuple[list[tuple[str, int, int, str]], list[DocReference], dict[str, str]]:
    """A body or comment cut as docs are: [(passage text, first line, last line, its docs chunk
    id)], the references to code found in it (by docs chunk id), and docs chunk id -> the docs id of
    the passage a reference in it lands in (a heading-only section's parent -> its first passage)."""
    if not text.strip():
        return [], [], {}
    # an issue tracker's Markdown has no roles: its code spans are the code it names
    doc = chunk_doc(source_id, file_path, text, "markdown", max_tokens=max_tokens, code_spans=True)
    children = [c for c in doc.chunks if c.role == "child"]
    first_of: dict[str, str] = {}
    for c in children:
        first_of.setdefault(c.parent_id, c.chunk_id)
        first_of[c.chunk_id] = c.chunk_id
    return [(c.text, c.start_line, c.end_line, c.chunk_id) for c in children], doc.references, first_of


def _masked(text: str) -> str:
    """`text` with its fenced code blocks blanked (same length and lines), so a `#12` in a log or
    an example is not a reference."""
    return _FENCED_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _line_at(text: str, offset: int) -> tuple[int, str]:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return text.count("\n", 0, offset), text[start:end if end >= 0 else len(text)].strip()


def _file_refs(text: str, first_line: int, chunk_id: str, file_path: str) -> list[DocReference]:
    masked = _masked(text)
    found: dict[int, tuple[str, str]] = {}
    for m in _TICK_PATH_RE.finditer(masked):
        found.setdefault(m.start(), (m.group("path"), m.group(0)))
    for m in _BARE_PATH_RE.finditer(masked):
        found.setdefault(m.start(), (m.group("path"), m.group(0)))
    out = []
    for offset in sorted(found):
        path, matched = found[offset]
        out.append(DocReference(chunk_id=chunk_id, file_path=file_path,
                                line=first_line + _line_at(text, offset)[0], ref_kind="file", role="",
                                target=path.lstrip("./") if path.startswith("./") else path,
                                matched_text=matched))
    return out


def _issue_refs(fmt: str, issue: Issue, text: str) -> list[tuple[str, int, str]]:
    """(target key, offset, matched text) of every issue `text` names (fenced code left out)."""
    masked = _masked(text)
    out: list[tuple[str, int, str]] = []
    if fmt == "jira":
        for m in _JIRA_REF_RE.finditer(masked):
            out.append((m.group("key"), m.start(), m.group(0)))
        return out
    for m in _GH_URL_RE.finditer(masked):
        out.append((_gh_key(m.group("repo"), int(m.group("num"))), m.start(), m.group(0)))
    urls = [(m.start(), m.end()) for m in _GH_URL_RE.finditer(masked)]
    for m in _GH_REF_RE.finditer(masked):
        if any(s <= m.start() < e for s, e in urls):
            continue
        out.append((_gh_key(m.group("repo") or issue.repository, int(m.group("num"))), m.start(), m.group(0)))
    return sorted(out, key=lambda r: r[1])


def most_recent(issues: list[Issue], max_issues: int) -> list[Issue]:
    """The `max_issues` most recently updated of `issues` (created, then the higher number, where
    the dates tie), in their order."""
    if len(issues) <= max_issues:
        return issues
    newest = sorted(range(len(issues)), reverse=True,
                    key=lambda i: (issues[i].updated_at or issues[i].created_at, issues[i].created_at, issues[i].number))
    return [issues[i] for i in sorted(newest[:max_issues])]


def chunk_issue_export(source_id: str, file_path: str, text: str, max_tokens: int = 256,
                       max_issues: int = DEFAULT_MAX_ISSUES) -> ParsedFile:
    """Chunks, Issue nodes, CONTAINS / REFERENCES relations and code references of one export file
    (raises IssueExportError when it is not one). At most `max_issues` issues, the most recently
    updated; past it a warning names the file and what was left out (chunking/limits.py)."""
    export = parse_export(text)
    out = ParsedFile(warnings=[f"{file_path}: {w}" for w in export.warnings])
    if len(export.issues) > max_issues:
        kept = most_recent(export.issues, max_issues)
        oldest = min(i.updated_at or i.created_at for i in kept)
        out.warnings.append(cut_warning(
            file_path, f"{len(export.issues)} issues over max_issues={max_issues}; indexed the {max_issues} most "
            f"recently updated" + (f" (updated {oldest} or later)" if oldest else ""), key="max_issues"))
        export.issues = kept
    references: list[tuple[Issue, str, Chunk, int, str, str]] = []  # (from, target key, chunk, line, line text, matched)
    for issue in export.issues:
        parts = _issue_parent(source_id, file_path, export.format, issue, max_tokens, out, references)
        context = f"{parts.title} ({issue.state})"
        _add_children(parts, issue.body, "issue_body", (), "", "", context)
        for n, comment in enumerate(issue.comments, start=1):
            who = comment.author or "someone"
            lead = f"{who}" + (f" on {comment.created_at[:10]}" if comment.created_at else "") + ": "
            _add_children(parts, comment.body, "issue_comment", (comment.comment_id,), f" > comment {n}", lead,
                          f"{context}, comment by {who}")
    _add_issue_references(source_id, file_path, export, references, out)
    return out


@dataclass
class _IssueParts:
    """One issue being chunked: its parent chunk and node, what each of its chunks shares, and
    where they go (`out`; `references`: the issue keys its passages name)."""
    source_id: str
    file_path: str
    export_format: str
    issue: Issue
    max_tokens: int
    out: ParsedFile
    references: list
    node_id: str
    title: str
    header: str
    parent: Chunk
    common: dict


def _issue_parent(source_id: str, file_path: str, export_format: str, issue: Issue, max_tokens: int,
                  out: ParsedFile, references: list) -> _IssueParts:
    """An issue's parent chunk (its header and the head of its body) and its Issue node."""
    node_id = issue_node_id(source_id, issue.key)
    title = f"{issue.display} {issue.title}".strip()
    language = "markdown" if export_format == "github" else "jira"
    common = dict(file_path=file_path, symbol=issue.key, language=language, source_id=source_id,
                  source_kind=SOURCE_KIND, graph_ids=[node_id], issue_key=issue.key, state=issue.state)
    header = _header(issue)
    parent = Chunk(
        chunk_id=stable_id(source_id, file_path, "issue", issue.key), parent_id=None, role="parent",
        chunk_type="issue", start_line=1, end_line=_line_count(issue.body), title=title,
        summary=_first_sentence(issue.body) or title[:SUMMARY_MAX_CHARS],
        text=header + ("\n\n" + _body_head(issue.body) if issue.body.strip() else ""),
        locator=f"{file_path} > {issue.key}", **common).finalize()
    out.chunks.append(parent)
    out.nodes.append(GraphNode(
        node_id=node_id, label="Issue", name=issue.display, qualified_name=issue.key, source_id=source_id,
        file_path=file_path, start_line=1, end_line=_line_count(issue.body), chunk_id=parent.chunk_id,
        content_hash=parent.content_hash, properties=json.dumps({
            "key": issue.key, "number": issue.number, "title": issue.title, "state": issue.state,
            "labels": issue.labels, "author": issue.author, "created_at": issue.created_at,
            "updated_at": issue.updated_at, "closed_at": issue.closed_at, "url": issue.url,
            "is_pull_request": issue.is_pull_request, "issue_type": issue.issue_type,
            "comments": len(issue.comments)}, sort_keys=True)))
    return _IssueParts(source_id, file_path, export_format, issue, max_tokens, out, references, node_id, title,
                       header, parent, common)


def _add_children(parts: _IssueParts, body: str, kind: str, ident: tuple, where: str, summary_lead: str,
                  context: str) -> None:
    """The passages (child chunks) of an issue's body or of one comment, with their CONTAINS
    relations, code references and the issue keys they name."""
    source_id, file_path, issue, header, out = parts.source_id, parts.file_path, parts.issue, parts.header, parts.out
    passages, refs, first_of = _passages(source_id, file_path, body, parts.max_tokens)
    if not passages and kind == "issue_body":  # no body: the title is the issue's text
        passages = [(header, 1, 1, "")]
    mine: dict[str, Chunk] = {}
    for idx, (ptext, first, last, docs_id) in enumerate(passages):
        sentence = "" if ptext == header else _first_sentence(ptext)
        child = Chunk(
            chunk_id=stable_id(source_id, file_path, kind, issue.key, *ident, idx), parent_id=parts.parent.chunk_id,
            role="child", chunk_type=kind, start_line=first, end_line=last, title=parts.title,
            summary=(summary_lead + sentence if summary_lead else sentence or parts.title)[:SUMMARY_MAX_CHARS],
            text=ptext, locator=f"{file_path} > {issue.key}{where}:{first}-{last}",
            embed_text=f"{context}\n\n{ptext}" if ptext != header else "", **parts.common).finalize()
        out.chunks.append(child)
        mine[docs_id] = child
        out.relations.append(GraphRelation(
            stable_id("CONTAINS", parts.node_id, f"chunk:{child.chunk_id}"), "CONTAINS", parts.node_id,
            f"chunk:{child.chunk_id}", "VERIFIED", [], file_path, first, last, child.content_hash,
            f"{issue.key}{where}"[:200], source_id))
        out.references.extend(_file_refs(ptext, first, child.chunk_id, file_path))
        for target, offset, matched in _issue_refs(parts.export_format, issue, ptext):
            n, line_text = _line_at(ptext, offset)
            parts.references.append((issue, target, child, first + n, line_text, matched))
    for ref in refs:
        child = mine.get(first_of.get(ref.chunk_id, ""))
        if child is not None:
            ref.chunk_id, ref.file_path = child.chunk_id, file_path
            out.references.append(ref)


def _add_issue_references(source_id: str, file_path: str, export: IssueExport, references: list,
                          out: ParsedFile) -> None:
    """One REFERENCES relation per pair of issues of the export where one names the other."""
    by_key = {i.key.lower(): i for i in export.issues}
    seen: set[str] = set()
    for issue, target, chunk, line, line_text, matched in references:
        dst = by_key.get(target.lower())
        if dst is None or dst.key == issue.key:
            continue
        src_id, dst_id = issue_node_id(source_id, issue.key), issue_node_id(source_id, dst.key)
        rel_id = stable_id("REFERENCES", src_id, dst_id)
        if rel_id in seen:
            continue
        seen.add(rel_id)
        out.relations.append(GraphRelation(
            rel_id, "REFERENCES", src_id, dst_id, "VERIFIED", [], file_path, line, line,
            chunk.content_hash, (line_text or matched)[:200], source_id))
