"""Generation-bound continuation cursors and the pure search-after pagination.

A cursor is `o1.<key id>.<payload>.<signature>`: the payload is base64url canonical
JSON, the signature HMAC-SHA256 (key of `<key id>`) over `o1.<key id>.<payload>`. It is
opaque to clients but not secret: it holds no query text, only

- `fp`: the request fingerprint, itself an HMAC (same key) over the normalized request
  (namespace, scope, filters incl. the caller's galaxy, allowed ids, profile id and
  recipe, sort, query-text digest, endpoint) — a cursor cannot be replayed on another
  request, and the fingerprint cannot be brute-forced back to a query text without the key;
- `gen`, `seq`: the generation every page reads and its commit sequence at page 1;
- `at`: the ranking time of page 1 (freshness is computed at that instant on every
  page, so the fused order does not drift with the clock);
- `depths`: the per-source candidate depths of page 1 (the candidate window);
- `page`, `offset`, `after`: pages and results returned so far, and the search-after
  tuple `(fused score, document_id)` of the last result;
- `exp`: expiry (unix seconds).

Keys: `ORRERY_CURSOR_KEYS="kid1:secret,kid0:oldsecret"` — the first signs, all verify,
so a key is rotated by prepending a new one and dropping the old one after one TTL.
Workers behind one load balancer must share the keys.

Every part has exactly one accepted spelling (unpadded base64url, canonical trailing
bits): an encoding variant of a valid cursor is `400 invalid_continuation`, like any
other tampering. Checks, in this order: format, key id and signature → `400
invalid_continuation`; expiry → `410 expired_continuation`; fingerprint → `400
invalid_continuation`.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from contracts.errors import ErrorCode, OrreryError

__all__ = [
    "CURSOR_VERSION",
    "SORT",
    "CursorCodec",
    "CursorPosition",
    "Page",
    "paginate",
    "parse_cursor_keys",
]

log = logging.getLogger("orrery.query")

CURSOR_VERSION = "o1"
# The one order pages walk: fused score descending, ties on document_id ascending.
SORT = "fused_score_desc,document_id_asc"
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")


class Ranked(Protocol):
    """What pagination needs of a fused candidate."""

    @property
    def document_id(self) -> str: ...

    @property
    def score(self) -> float: ...


@dataclass(frozen=True, slots=True)
class CursorPosition:
    """Where a paged request stands after one page (what a cursor carries)."""

    generation_id: str
    commit_seq: int
    ranked_at: datetime
    depths: Mapping[str, int]
    page: int
    offset: int
    after_score: float
    after_document_id: str

    def as_json(self) -> dict[str, Any]:
        return {
            "gen": self.generation_id,
            "seq": self.commit_seq,
            "at": self.ranked_at.isoformat(),
            "depths": dict(sorted(self.depths.items())),
            "page": self.page,
            "offset": self.offset,
            "after": [self.after_score, self.after_document_id],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> CursorPosition:
        after = raw["after"]
        ranked_at = datetime.fromisoformat(str(raw["at"]))
        if ranked_at.tzinfo is None:
            raise ValueError("naive ranking time")
        return cls(
            generation_id=str(raw["gen"]),
            commit_seq=int(raw["seq"]),
            ranked_at=ranked_at,
            depths={str(k): int(v) for k, v in dict(raw["depths"]).items()},
            page=int(raw["page"]),
            offset=int(raw["offset"]),
            after_score=float(after[0]),
            after_document_id=str(after[1]),
        )


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a best-first list: `items`, how many came before (`offset`), whether
    anything follows inside the window (`has_more`), and the window size."""

    items: list[Any]
    offset: int
    has_more: bool
    window: int


def _order_key(score: float, document_id: str) -> tuple[float, str]:
    return (-score, document_id)


def paginate(
    ranked: Sequence[Ranked], page_size: int, after: tuple[float, str] | None = None
) -> Page:
    """The `page_size` candidates strictly after `after` (score, document_id) in
    `ranked`, which is sorted by score descending, ties on document_id ascending (the
    order `query.fusion` produces). `after=None` starts at the top.

    Strictly after means: a lower score, or the same score and a greater document id —
    so a page never repeats the previous page's last document, and walking a fixed list
    page by page yields each element exactly once, in order.
    """
    if page_size < 1:
        raise ValueError("page_size must be at least 1")
    keys = [_order_key(c.score, c.document_id) for c in ranked]
    start = 0 if after is None else bisect.bisect_right(keys, _order_key(*after))
    items = list(ranked[start : start + page_size])
    return Page(
        items=items, offset=start, has_more=start + len(items) < len(ranked), window=len(ranked)
    )


def parse_cursor_keys(spec: str) -> list[tuple[str, bytes]]:
    """`kid1:secret,kid0:oldsecret` → `[(kid, secret bytes), …]`, signing key first.

    Raises `ValueError` for an empty id or secret, a duplicate id, or a secret shorter
    than 16 bytes.
    """
    keys: list[tuple[str, bytes]] = []
    for part in spec.split(","):
        if not part.strip():
            continue
        kid, separator, secret = part.strip().partition(":")
        if not separator or not kid or not secret:
            raise ValueError("ORRERY_CURSOR_KEYS: give kid:secret pairs, comma-separated")
        if not kid.replace("-", "").replace("_", "").isalnum() or "." in kid:
            raise ValueError(f"ORRERY_CURSOR_KEYS: key id {kid!r}: letters, digits, - and _")
        if len(secret.encode()) < 16:
            raise ValueError(f"ORRERY_CURSOR_KEYS: the secret of {kid!r} is under 16 bytes")
        if any(kid == held for held, _ in keys):
            raise ValueError(f"ORRERY_CURSOR_KEYS: key id {kid!r} appears twice")
        keys.append((kid, secret.encode()))
    return keys


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    """The bytes `text` encodes, only when `text` is their one canonical encoding: unpadded
    base64url with zero trailing bits (as `_b64` writes it). Base64 decoders forgive
    padding, the standard alphabet and stray bits, so one signature had many spellings;
    now a cursor has exactly one. Raises `ValueError` otherwise."""
    if not _BASE64URL.fullmatch(text):
        raise ValueError("not unpadded base64url")
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:
        raise ValueError("not the canonical base64url encoding")
    return raw


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _invalid(message: str) -> OrreryError:
    return OrreryError(
        ErrorCode.INVALID_CONTINUATION,
        f"invalid cursor: {message}; start again without a cursor",
        {"reason": message},
    )


class CursorCodec:
    """Issues and opens cursors (see the module docstring). Immutable, thread-safe.

    Guarantees: `open` returns a position only for a cursor this codec's keys signed,
    unexpired at `now`, issued for a request with the same fingerprint material;
    otherwise it raises `invalid_continuation` or `expired_continuation`.
    """

    def __init__(self, keys: Sequence[tuple[str, bytes]], *, ttl_seconds: float) -> None:
        if not keys:
            raise ValueError("a cursor codec needs at least one key")
        self._keys = dict(keys)
        self._signing_kid = keys[0][0]
        self.ttl_seconds = ttl_seconds

    @classmethod
    def ephemeral(cls, *, ttl_seconds: float) -> CursorCodec:
        """A codec with a random key of this process only: cursors die with the process
        and no other worker accepts them."""
        return cls([(f"p{secrets.token_hex(4)}", secrets.token_bytes(32))], ttl_seconds=ttl_seconds)

    @property
    def signing_key_id(self) -> str:
        return self._signing_kid

    def _fingerprint(self, key: bytes, material: Mapping[str, Any]) -> str:
        return _b64(hmac.new(key, b"fp\x00" + _canonical(material), hashlib.sha256).digest())

    def issue(
        self, position: CursorPosition, material: Mapping[str, Any], *, now: datetime
    ) -> tuple[str, datetime]:
        """A signed cursor for `position` of the request `material` describes, and its
        expiry."""
        key = self._keys[self._signing_kid]
        expires = int(now.timestamp() + self.ttl_seconds)
        body = {**position.as_json(), "fp": self._fingerprint(key, material), "exp": expires}
        head = f"{CURSOR_VERSION}.{self._signing_kid}.{_b64(_canonical(body))}"
        signature = _b64(hmac.new(key, head.encode(), hashlib.sha256).digest())
        return f"{head}.{signature}", datetime.fromtimestamp(expires, UTC)

    def open(self, token: str, material: Mapping[str, Any], *, now: datetime) -> CursorPosition:
        """The position a cursor carries, after checking it (see the class docstring)."""
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != CURSOR_VERSION:
            raise _invalid("not a cursor of this format")
        _, kid, payload, signature = parts
        key = self._keys.get(kid)
        if key is None:
            raise _invalid("signed with an unknown key")
        expected = hmac.new(key, f"{CURSOR_VERSION}.{kid}.{payload}".encode(), hashlib.sha256)
        try:
            given = _unb64(signature)
        except (binascii.Error, ValueError):
            raise _invalid("malformed signature") from None
        if not hmac.compare_digest(expected.digest(), given):
            raise _invalid("the signature does not match")
        try:
            body = json.loads(_unb64(payload))
            position = CursorPosition.from_json(body)
            expires = int(body["exp"])
            fingerprint = str(body["fp"])
        except (binascii.Error, ValueError, KeyError, TypeError, IndexError):
            raise _invalid("malformed payload") from None
        if now.timestamp() >= expires:
            raise OrreryError(
                ErrorCode.EXPIRED_CONTINUATION,
                "the cursor expired; start again without a cursor",
                {"expired_at": datetime.fromtimestamp(expires, UTC).isoformat()},
            )
        if not hmac.compare_digest(fingerprint, self._fingerprint(key, material)):
            raise _invalid("the request differs from the one the cursor was issued for")
        return position
