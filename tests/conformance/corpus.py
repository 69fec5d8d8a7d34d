"""A small fixed corpus shared by the lexical and vector conformance suites.

Vectors are hand-made unit vectors in 4 dimensions so that nearest-neighbour order is
known exactly; texts are chosen so that BM25 order is known for the queries used.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from contracts.index import IndexDocument

DIM = 4


def unit(*xs: float) -> tuple[float, ...]:
    norm = math.sqrt(sum(x * x for x in xs))
    return tuple(x / norm for x in xs)


def doc(
    document_id: str,
    revision: int = 1,
    *,
    title: str = "",
    body: str = "",
    tags: tuple[str, ...] = (),
    galaxy: str = "default",
    status: str = "active",
    visibility: tuple[str, ...] = (),
    facets: dict[str, tuple[str, ...]] | None = None,
    updated_at: datetime = datetime(2026, 3, 19, 12, 0, tzinfo=UTC),
    vector: tuple[float, ...] | None = None,
    ring: str = "",
) -> IndexDocument:
    return IndexDocument(
        document_id=document_id,
        revision=revision,
        item_id=f"item:{document_id}",
        galaxy=galaxy,
        ring=ring,
        status=status,
        updated_at=updated_at,
        visibility=visibility,
        facets=facets or {},
        title=title,
        body=body,
        tags=tags,
        vector=vector if vector is not None else unit(1, 0, 0, 0),
    )


CORPUS: list[IndexDocument] = [
    doc(
        "d1",
        title="red thermos",
        body="the red thermos stood in the hall cupboard",
        vector=unit(1, 0, 0, 0),
        status="active",
        visibility=("family",),
        facets={"room": ("hall",)},
        updated_at=datetime(2026, 1, 1, tzinfo=UTC),
    ),
    doc(
        "d2",
        title="blue kettle",
        body="the kettle is in the kitchen next to the thermos",
        vector=unit(0.9, 0.1, 0, 0),
        status="candidate",
        visibility=("family", "guests"),
        facets={"room": ("kitchen",)},
        updated_at=datetime(2026, 2, 1, tzinfo=UTC),
    ),
    doc(
        "d3",
        title="Rote Thermoskanne",
        body="Früher stand die rote Thermoskanne im Flurschrank",
        vector=unit(0, 1, 0, 0),
        status="active",
        visibility=("private",),
        facets={"room": ("flur",), "lang": ("de",)},
        updated_at=datetime(2026, 3, 1, tzinfo=UTC),
    ),
    doc(
        "d4",
        title="garden hose",
        body="the hose is coiled behind the shed",
        vector=unit(0, 0, 1, 0),
        status="archived",
        visibility=("family",),
        facets={"room": ("garden",)},
        updated_at=datetime(2026, 4, 1, tzinfo=UTC),
    ),
    doc(
        "d5",
        title="thermos lid",
        body="a spare lid for the thermos",
        vector=unit(0.7, 0.7, 0, 0),
        status="active",
        galaxy="other",
        visibility=("family",),
        updated_at=datetime(2026, 5, 1, tzinfo=UTC),
    ),
]


# Namespaces the rule accepts (`contracts.names`) that must never become a name as they
# are: Twinr's, path tricks without `/` (which the rule refuses), another script and an
# emoji, 255 characters, and a case twin of "ns" (OpenSearch folds case).
HOSTILE_NAMESPACES: tuple[str, ...] = (
    "twinr_longterm_v1:twinr:deff13356ec6",
    "twinr_longterm_v1:Mein Zuhause (alt):a7f1ed265838",
    "..",
    "..:..%2F..",
    "日本語 🪐 Küche",
    "NS",
    "n" * 255,
)
