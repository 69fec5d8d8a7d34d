"""Namespaces, and the one encoding that turns a namespace into a name of a technology.

The namespace rule (`Namespace`): 1-255 characters; none is a control character
(C0, DEL, C1), a line or paragraph separator (U+2028/9), a lone surrogate, `/` or `\\`;
the first and the last are not whitespace. So Twinr's namespaces are valid as Twinr
builds them: `twinr_longterm_v1:<root>:<sha1[:12]>`, `<root>` the basename of its project
directory (letters of any script, spaces, `:`, `.`, …), or an operator's override.

A namespace never becomes a name as it is. Every adapter that names something after a
namespace — Kafka topics, OpenSearch and Qdrant aliases, cache keys, paths — calls
`namespace_token`, whose result is
- the namespace itself when it is already a plain name: `[a-z0-9][a-z0-9_-]{0,63}`
  (so `demo` and `twinr-prod` keep the names they always had);
- otherwise `_` + a readable slug (at most 24 of `[a-z0-9-]`, for people reading
  topic lists) + `-` + 26 base32 characters of the sha256 of the namespace's UTF-8
  bytes (130 bits): `twinr_longterm_v1:Wohnung:deff13356ec6` →
  `_twinr-longterm-v1-wohnung-<hash>`.
Tokens are 1-64 characters of `[a-z0-9_-]`, lowercase (OpenSearch folds case), without
`.` (the separator of `live.<token>.<kind>`), `/`, or anything a path could resolve; a
hashed token starts with `_`, which a plain one never does, so two namespaces never
share a token (short of a sha256 collision). The token is one-way: where the namespace
is needed it is read from the event or the registry, never parsed out of a name.

Document ids are unaffected: `contracts.records.derive_document_id` hashes the
namespace itself.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema

__all__ = [
    "NAMESPACE_MAX_LENGTH",
    "NAMESPACE_PATTERN",
    "TOKEN_MAX_LENGTH",
    "Namespace",
    "check_namespace",
    "live_alias_name",
    "namespace_token",
]

NAMESPACE_MAX_LENGTH = 255
TOKEN_MAX_LENGTH = 64

# One rule for Python and for JSON Schema readers (ECMA, Rust): no lookarounds, `\u`
# escapes, whitespace spelled out (each engine's `\s` differs: ECMA's has U+FEFF, not
# U+0085; these are Python's `\s` less the characters `_BAD` refuses anyway).
_SPACE = r"\u0020\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"
_BAD_TEXT = r"\u0000-\u001f\u007f-\u009f\u2028\u2029/\\"


def _pattern(bad: str) -> str:
    edge = f"[^{_SPACE}{bad}]"
    return rf"^{edge}(?:[^{bad}]{{0,{NAMESPACE_MAX_LENGTH - 2}}}{edge})?$"


# The JSON Schema pattern: a JSON text cannot carry a lone surrogate but as an escape,
# which the body loader refuses (`400 invalid_json`), and no regex engine of a JSON
# Schema validator compiles a surrogate range.
NAMESPACE_PATTERN = _pattern(_BAD_TEXT)
_NAMESPACE = re.compile(_pattern(_BAD_TEXT + r"\ud800-\udfff"))
_PLAIN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_SLUG_DROP = re.compile(r"[^a-z0-9]+")
_SLUG_MAX = 24
_HASH_CHARS = 26


def check_namespace(value: str) -> str:
    """`value` if it is a namespace, else `ValueError` saying the rule."""
    if not _NAMESPACE.fullmatch(value):
        raise ValueError(
            f"a namespace is 1-{NAMESPACE_MAX_LENGTH} characters without control "
            "characters, line separators, lone surrogates, '/' or '\\', and does not "
            "start or end with whitespace"
        )
    return value


def namespace_token(namespace: str) -> str:
    """The name-safe token of a namespace (see the module docstring): deterministic,
    1-64 characters of `[a-z0-9_-]`, distinct for distinct namespaces."""
    if _PLAIN.fullmatch(namespace):
        return namespace
    # surrogatepass: a lone surrogate still gets a token (the rule rejects it earlier).
    digest = hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).digest()
    hashed = base64.b32encode(digest).decode("ascii").lower()[:_HASH_CHARS]
    slug = _SLUG_DROP.sub("-", namespace.lower()).strip("-")[:_SLUG_MAX].strip("-")
    return f"_{slug}-{hashed}" if slug else f"_{hashed}"


def live_alias_name(namespace: str, snapshot_kind: str, prefix: str | None = None) -> str:
    """The name of the alias that mirrors a scope's live pointer: `live.<token>.<kind>`,
    as `{prefix}-live.<token>.<kind>` when the engine's names carry a prefix. The token
    has no `.`, so the name splits back into token and kind at its first `.` after
    `live`. (OpenSearch folds the name to lowercase; the token already is.)"""
    name = f"live.{namespace_token(namespace)}.{snapshot_kind}"
    return name if prefix is None else f"{prefix}-{name}"


Namespace = Annotated[
    str,
    AfterValidator(check_namespace),
    WithJsonSchema(
        {"type": "string", "pattern": NAMESPACE_PATTERN, "maxLength": NAMESPACE_MAX_LENGTH}
    ),
]
