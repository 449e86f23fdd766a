"""mtrag's error hierarchy. Library code raises these; only the CLI and HTTP layers turn them into
exit codes and status codes (`exit_code` / `http_status` say which), so a caller can catch
`MtragError` for everything mtrag itself refuses, and let programming errors stay tracebacks."""
from __future__ import annotations


class MtragError(Exception):
    """Base of every error mtrag raises on purpose: the message names the input and why."""

    exit_code = 1
    http_status = 500


class ConfigError(MtragError, ValueError):
    """Bad configuration or arguments: a source file, an option, a bind address."""

    exit_code = 2
    http_status = 400


class BusyError(MtragError, RuntimeError):
    """Someone else holds what this needs (a source's build lock, an embedded store's folder)."""

    exit_code = 75  # EX_TEMPFAIL: try again later
    http_status = 409


class StoreError(MtragError, RuntimeError):
    """A store refused or failed an operation."""


class PublishError(MtragError, RuntimeError):
    """A generation could not be published (the gate refused it, or a manifest is unreadable)."""


class NotPublished(MtragError, LookupError):
    """A read (query, paths, status) of a home with no published generation."""

    http_status = 503
