"""Continuation cursors: signing, rotation, expiry, fingerprints, and search-after
pagination over random fused rankings (a seeded property test)."""

from __future__ import annotations

import base64
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.errors import ErrorCode, OrreryError
from contracts.index import Candidate
from contracts.profiles import RrfProfile, WeightedProfile
from query.cursors import CursorCodec, CursorPosition, _b64, _unb64, paginate, parse_cursor_keys
from query.fusion import FusedCandidate, fuse

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
KEYS = [("k1", b"0123456789abcdef-new"), ("k0", b"0123456789abcdef-old")]
MATERIAL = {"namespace": "ns", "scope_ref": "longterm:objects:current", "query_text": "ab12"}


def position(**overrides: object) -> CursorPosition:
    values: dict[str, object] = {
        "generation_id": "g7",
        "commit_seq": 12,
        "ranked_at": NOW,
        "depths": {"lexical": 100, "vector": 100},
        "page": 1,
        "offset": 10,
        "after_score": 0.123456789012345678,
        "after_document_id": "doc-9",
    }
    values.update(overrides)
    return CursorPosition(**values)  # type: ignore[arg-type]


def codec(keys: list[tuple[str, bytes]] = KEYS, ttl: float = 60.0) -> CursorCodec:
    return CursorCodec(keys, ttl_seconds=ttl)


def code_of(call: object) -> ErrorCode:
    with pytest.raises(OrreryError) as caught:
        call()  # type: ignore[operator]
    return caught.value.code


# -- the codec ------------------------------------------------------------------------------


def test_round_trip_keeps_the_exact_position() -> None:
    token, expires = codec().issue(position(), MATERIAL, now=NOW)
    assert expires == NOW + timedelta(seconds=60)
    assert token.startswith("o1.k1.")
    opened = codec().open(token, MATERIAL, now=NOW + timedelta(seconds=59))
    assert opened == position()
    assert opened.after_score == 0.123456789012345678  # floats survive bit for bit


def test_the_cursor_holds_no_query_text() -> None:
    material = {**MATERIAL, "query_text_raw_would_be": "Wo stand meine Thermoskanne"}
    token, _ = codec().issue(position(), material, now=NOW)
    import base64

    payload = base64.urlsafe_b64decode(token.split(".")[2] + "==").decode()
    assert "Thermoskanne" not in payload and "ab12" not in payload


def test_tampered_payload_or_signature_is_invalid() -> None:
    token, _ = codec().issue(position(), MATERIAL, now=NOW)
    head, kid, payload, signature = token.split(".")
    flipped = payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1]
    for bad in (
        f"{head}.{kid}.{flipped}.{signature}",
        f"{head}.{kid}.{payload}.{signature[:-1]}x",
        f"{head}.{kid}.{payload}",
        "o2." + token[3:],
        "garbage",
        f"{head}.{kid}.{payload}.!!!",
    ):
        assert code_of(lambda b=bad: codec().open(b, MATERIAL, now=NOW)) is (  # type: ignore[misc]
            ErrorCode.INVALID_CONTINUATION
        ), bad


_STANDARD_ALPHABET = str.maketrans("-_", "+/")
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def spellings(part: str) -> list[str]:
    """Other encodings of the bytes `part` encodes: padded, the standard alphabet, and
    every other value of the trailing bits a decoder ignores."""
    out = [part + "=", part + "==", part + "=" * (-len(part) % 4)]
    out.append(part.translate(_STANDARD_ALPHABET))
    unused_bits = {2: 4, 3: 2}.get(len(part) % 4, 0)  # 1 or 2 bytes in the last group
    last = _B64.index(part[-1])
    for low in range(1 << unused_bits):
        out.append(part[:-1] + _B64[(last & ~((1 << unused_bits) - 1)) | low])
    return [s for s in out if s != part]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64))
def test_only_the_canonical_base64url_decodes(raw: bytes) -> None:
    canonical = _b64(raw)
    assert _unb64(canonical) == raw
    for other in spellings(canonical):
        assert base64.b64decode(other.translate(_STANDARD_ALPHABET) + "==") == raw or "=" in other
        with pytest.raises(ValueError):
            _unb64(other)


def test_a_cursor_has_one_spelling() -> None:
    """A valid cursor re-encoded (padding appended, standard alphabet, other trailing
    bits) is tampering: 400 invalid_continuation, like a changed byte."""
    tried = 0
    for offset in range(40):
        token, _ = codec().issue(position(offset=offset), MATERIAL, now=NOW)
        assert codec().open(token, MATERIAL, now=NOW) == position(offset=offset)
        head, kid, payload, signature = token.split(".")
        variants = [token + "=", token + "=="]
        variants += [f"{head}.{kid}.{payload}.{s}" for s in spellings(signature)]
        variants += [f"{head}.{kid}.{p}.{signature}" for p in spellings(payload)]
        for bad in variants:
            assert code_of(lambda b=bad: codec().open(b, MATERIAL, now=NOW)) is (  # type: ignore[misc]
                ErrorCode.INVALID_CONTINUATION
            ), bad
        tried += signature.translate(_STANDARD_ALPHABET) != signature
    assert tried > 0  # some signatures held '-' or '_': the alphabet swap was exercised


def test_a_cursor_of_another_key_set_is_invalid() -> None:
    token, _ = codec().issue(position(), MATERIAL, now=NOW)
    stranger = codec([("k1", b"another-secret-of-16+")])
    assert code_of(lambda: stranger.open(token, MATERIAL, now=NOW)) is (
        ErrorCode.INVALID_CONTINUATION
    )
    ephemeral = CursorCodec.ephemeral(ttl_seconds=60)
    assert code_of(lambda: ephemeral.open(token, MATERIAL, now=NOW)) is (
        ErrorCode.INVALID_CONTINUATION
    )


def test_rotation_first_key_signs_all_verify() -> None:
    old_only = codec([KEYS[1]])
    old_token, _ = old_only.issue(position(), MATERIAL, now=NOW)
    assert old_token.startswith("o1.k0.")
    rotated = codec()  # k1 new and first, k0 still verifies
    assert rotated.open(old_token, MATERIAL, now=NOW) == position()
    assert rotated.issue(position(), MATERIAL, now=NOW)[0].startswith("o1.k1.")
    retired = codec([KEYS[0]])  # k0 dropped after one TTL
    assert code_of(lambda: retired.open(old_token, MATERIAL, now=NOW)) is (
        ErrorCode.INVALID_CONTINUATION
    )


def test_expired_cursor_is_410_after_the_signature_check() -> None:
    token, _ = codec(ttl=30).issue(position(), MATERIAL, now=NOW)
    later = NOW + timedelta(seconds=31)
    with pytest.raises(OrreryError) as caught:
        codec().open(token, MATERIAL, now=later)
    assert caught.value.code is ErrorCode.EXPIRED_CONTINUATION
    assert caught.value.http_status == 410
    # An expired but tampered cursor is reported as tampered, not as expired.
    head, kid, payload, signature = token.split(".")
    assert code_of(
        lambda: codec().open(f"{head}.{kid}.{payload}.{signature[:-2]}AA", MATERIAL, now=later)
    ) in (ErrorCode.INVALID_CONTINUATION,)


def test_a_different_request_is_invalid() -> None:
    token, _ = codec().issue(position(), MATERIAL, now=NOW)
    for change in ({"query_text": "other"}, {"scope_ref": "graph:current"}, {"extra": 1}):
        with pytest.raises(OrreryError) as caught:
            codec().open(token, {**MATERIAL, **change}, now=NOW)
        assert caught.value.code is ErrorCode.INVALID_CONTINUATION
        assert caught.value.http_status == 400
        assert "differs" in caught.value.message


def test_parse_cursor_keys() -> None:
    assert parse_cursor_keys("") == []
    assert parse_cursor_keys("kid1:0123456789abcdef, kid0:fedcba9876543210") == [
        ("kid1", b"0123456789abcdef"),
        ("kid0", b"fedcba9876543210"),
    ]
    for bad in ("kid1", "kid1:short", ":0123456789abcdef", "a.b:0123456789abcdef"):
        with pytest.raises(ValueError):
            parse_cursor_keys(bad)
    with pytest.raises(ValueError, match="twice"):
        parse_cursor_keys("a:0123456789abcdef,a:0123456789abcdeg")


# -- pagination: a seeded property test over random corpora ---------------------------------


def random_sources(rng: random.Random) -> tuple[list[Candidate], list[Candidate]]:
    """Two best-first candidate lists over a random corpus, with many score ties."""
    size = rng.randrange(0, 80)
    ids = [f"d{rng.randrange(10_000):05d}" for _ in range(size)]
    ids = sorted(set(ids))
    levels = rng.choice([3, 10, 1_000])  # few levels = many ties

    def source(share: float) -> list[Candidate]:
        picked = [d for d in ids if rng.random() < share]
        out = [
            Candidate(
                document_id=d,
                revision=1,
                score=rng.randrange(levels) / levels,
                status=rng.choice(["active", "candidate", "superseded"]),
                updated_at=NOW - timedelta(days=rng.randrange(3) * 10),
            )
            for d in picked
        ]
        out.sort(key=lambda c: (-c.score, c.document_id))
        return out

    return source(0.7), source(0.6)


PROFILES = [
    WeightedProfile(id="w@1"),
    WeightedProfile(id="w@2", normalization="z_score", freshness_weight=0.0),
    WeightedProfile(id="w@3", lexical_weight=0.0, vector_weight=0.0, metadata_weight=1.0),
    RrfProfile(id="r@1", rrf_k=1.0, rank_window=20),
]


def walk(ranking: list[FusedCandidate], rng: random.Random) -> list[list[FusedCandidate]]:
    """Page through `ranking` with random page sizes (each page re-ranked from
    scratch, as a worker does), following the search-after tuple."""
    pages: list[list[FusedCandidate]] = []
    after: tuple[float, str] | None = None
    while True:
        page = paginate(list(ranking), rng.randrange(1, 12), after)
        if page.items:
            pages.append(page.items)
        if not page.has_more:
            assert page.offset + len(page.items) == len(ranking)
            return pages
        assert page.items, "has_more with an empty page"
        after = (page.items[-1].score, page.items[-1].document_id)


def test_pages_never_repeat_or_skip_over_random_corpora_and_page_sizes() -> None:
    rng = random.Random(20261129)
    for _ in range(400):
        lexical, vector = random_sources(rng)
        profile = rng.choice(PROFILES)
        ranking = fuse(profile, lexical, vector, now=NOW, half_life_days=30.0)
        # The same inputs rank identically every time: each page may re-run the ranking.
        assert fuse(profile, lexical, vector, now=NOW, half_life_days=30.0) == ranking
        pages = walk(ranking, rng)
        flat = [c.document_id for page in pages for c in page]
        assert flat == [c.document_id for c in ranking]  # in order, none twice, none missing
        assert len(set(flat)) == len(flat)
        for page in pages:  # strictly descending in (score, -document_id) within a page
            keys = [(-c.score, c.document_id) for c in page]
            assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_a_cursor_past_the_window_gives_an_empty_last_page() -> None:
    ranking = [FusedCandidate(f"d{i}", 1, 1.0 - i / 10, 0, 0, 0, 0) for i in range(5)]
    page = paginate(ranking, 3, (0.0, "zzz"))
    assert page.items == [] and not page.has_more and page.offset == 5 and page.window == 5
    tied = [FusedCandidate(d, 1, 0.5, 0, 0, 0, 0) for d in ("a", "b", "c")]
    assert [c.document_id for c in paginate(tied, 5, (0.5, "a")).items] == ["b", "c"]
    assert [c.document_id for c in paginate(tied, 1).items] == ["a"]
    with pytest.raises(ValueError):
        paginate(tied, 0)
