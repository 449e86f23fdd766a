"""Who a request is, for `mtrag serve` and `mtrag mcp`: MTRAG_API_KEY, one key that reads every
source, and MTRAG_API_KEYS_FILE, a YAML file of team keys, each bound to the source ids its team
may read:

    keys:
      - name: team-a
        key_sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
        sources: [a, a-docs]

The file holds the SHA-256 of each key (hex), never the key: a copy of the file lets no one in.
A key given by a request is hashed once and compared with every entry (and with MTRAG_API_KEY's
hash) by `hmac.compare_digest`, all of them whichever matches, so the time taken says nothing
about which entry or how much of a key matched. A team's `sources` need not be published yet: its
scope is those of them the served generation holds."""
from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from mtrag_resources.core.config import env
from mtrag_resources.core.errors import ConfigError

ENTRY_FIELDS = {"name", "key_sha256", "sources"}
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Principal:
    """Who asks: a team key's `name` and `sources`, or MTRAG_API_KEY (or no key configured):
    `sources` None, every source."""

    name: str
    sources: frozenset[str] | None = None


EVERY_SOURCE = Principal("*")


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class ApiKeys:
    """The keys a server accepts: `master` (MTRAG_API_KEY: every source) and the team keys."""

    def __init__(self, master: str | None = None, teams: dict[bytes, Principal] | None = None,
                 origin: str = "MTRAG_API_KEYS_FILE"):
        self._master = key_digest(master) if master else None
        self._teams = dict(teams or {})
        if self._master is not None and self._master in self._teams:
            raise ConfigError(f"{origin}: {self._teams[self._master].name}'s key_sha256 is MTRAG_API_KEY's: "
                              "a team key must differ from the key that reads every source")

    @property
    def required(self) -> bool:
        """Does a request need a key (any key configured)?"""
        return self._master is not None or bool(self._teams)

    @property
    def teams(self) -> list[Principal]:
        return sorted(self._teams.values(), key=lambda p: p.name)

    def authenticate(self, given: str | None) -> Principal | None:
        """Who `given` (a request's key; None or "": none) is, or None for no or a wrong key."""
        if not self.required:
            return EVERY_SOURCE
        if not given:
            return None
        digest = key_digest(given)
        found = None
        # every entry is compared, a match or not: the time does not tell which entry matched
        if self._master is not None and hmac.compare_digest(digest, self._master):
            found = EVERY_SOURCE
        for stored, principal in self._teams.items():
            if hmac.compare_digest(digest, stored):
                found = principal
        return found

    def team(self, name: str) -> Principal:
        """The team key named `name` (MTRAG_MCP_KEY_NAME binds an MCP process to it)."""
        for principal in self._teams.values():
            if principal.name == name:
                return principal
        names = [p.name for p in self.teams]
        raise ConfigError(f"MTRAG_MCP_KEY_NAME {name[:80]!r}: no key of that name in MTRAG_API_KEYS_FILE "
                          f"(its keys: {names or 'none'})")

    @classmethod
    def from_env(cls, master: str | None = None) -> "ApiKeys":
        """MTRAG_API_KEY (`master`, as Settings reads it) and the team keys of MTRAG_API_KEYS_FILE."""
        path = env("MTRAG_API_KEYS_FILE")
        return cls(master, load_team_keys(Path(path)) if path else {})


def load_team_keys(path: Path) -> dict[bytes, Principal]:
    """{key digest: Principal} from a keys file; ConfigError naming the file and the entry at fault."""
    where = f"MTRAG_API_KEYS_FILE {path}"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or set(data) != {"keys"} or not isinstance(data["keys"], list):
        raise ConfigError(f"{where}: must be a mapping with one field, `keys`: a list of "
                          "{name, key_sha256, sources}")
    out: dict[bytes, Principal] = {}
    names: set[str] = set()
    for i, entry in enumerate(data["keys"]):
        at = f"{where}: keys[{i}]"
        if not isinstance(entry, dict) or set(entry) != ENTRY_FIELDS:
            got = sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
            raise ConfigError(f"{at} must have exactly the fields {sorted(ENTRY_FIELDS)}, got {got}")
        name, digest, sources = entry["name"], entry["key_sha256"], entry["sources"]
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{at}.name must be a non-empty string")
        if name in names:
            raise ConfigError(f"{at}.name {name!r} is given twice")
        if isinstance(digest, (int, float)):  # all digits: YAML reads a number, and its leading zeros are gone
            raise ConfigError(f"{at}.key_sha256 is read as a number: write the 64 hex digits in quotes")
        if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest.strip().lower()):
            raise ConfigError(f"{at}.key_sha256 must be the 64 hex digits of the key's SHA-256 "
                              "(`printf %s \"$KEY\" | sha256sum`), not the key itself")
        raw = bytes.fromhex(digest.strip())
        if raw in out:
            raise ConfigError(f"{at}.key_sha256 is {out[raw].name!r}'s too: one key names one team")
        if not isinstance(sources, list) or not sources \
                or not all(isinstance(s, str) and s.strip() for s in sources):
            raise ConfigError(f"{at}.sources must be a non-empty list of source ids")
        names.add(name)
        out[raw] = Principal(name, frozenset(sources))
    return out
