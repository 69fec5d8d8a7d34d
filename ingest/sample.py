"""A deterministic sample corpus: the household memory of a home assistant ("Twinr").

Margarete (78) lives alone with her cat Minka in a house with a garden; her daughter Anna
(her own galaxy, `anna`) lives in Hamburg with Thomas and the children Lukas and Mia. The
assistant remembers where things are, preferences, routines, appointments, medication,
device settings, the garden, the pets and recipes, in German and English.

Records are assembled from small hand-written tables: location facts and preferences are
combined from things x places x phrasings and people x categories x values; the rest are
hand-written notes. Everything is pure and deterministic: the same namespace always yields
the same records, and `updated_at` is derived from the item id (a sha256, not `hash()`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from contracts.records import Record, RecordMetadata, RecordText

__all__ = [
    "CONFLICT_SCHEMA",
    "EPISODE_SCHEMA",
    "OBJECT_SCHEMA",
    "RELATION_SCHEMA",
    "SAMPLE_NAMESPACE",
    "sample_queries",
    "sample_records",
]

SAMPLE_NAMESPACE = "demo"

OBJECT_SCHEMA = "twinr_memory_object_record_v2"
CONFLICT_SCHEMA = "twinr_memory_conflict_record_v1"
EPISODE_SCHEMA = "twinr_midterm_episode_record_v1"
RELATION_SCHEMA = "twinr_graph_edge_record_v1"

# `updated_at` windows (UTC). Facts that replaced an archived one are stamped after the
# archive window, so an archived fact is always older than its successor.
_START = datetime(2025, 1, 1, tzinfo=UTC)
_END = datetime(2026, 11, 1, tzinfo=UTC)
_ARCHIVE_END = datetime(2025, 12, 31, tzinfo=UTC)
_SUCCESSOR_START = datetime(2026, 1, 1, tzinfo=UTC)
_CONFLICT_START = datetime(2025, 6, 1, tzinfo=UTC)

_FIXED_TIMES: Mapping[str, datetime] = {
    "fact:thermos_location_old": datetime(2026, 3, 19, 12, 0, tzinfo=UTC),
    "fact:thermos_location_current": datetime(2026, 9, 2, 8, 30, tzinfo=UTC),
    "conflict:thermos_location": datetime(2026, 9, 2, 8, 31, tzinfo=UTC),
    "archive:christmas_2025": datetime(2025, 12, 29, 17, 5, tzinfo=UTC),
}

# Items shown with a second revision (each item id still appears once).
_REVISED = frozenset(
    {
        "fact:thermos_location_current",
        "fact:heating_night_setback",
        "fact:twinr_volume",
        "fact:pref_margarete_coffee",
        "fact:med_metformin",
        "conflict:ramipril_dose",
        "rel:anna_daughter_of_margarete",
    }
)

_MONTHS_DE = (
    "Januar", "Februar", "März", "April", "Mai", "Juni",
    "Juli", "August", "September", "Oktober", "November", "Dezember",
)  # fmt: skip
_MONTHS_EN = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


# --------------------------------------------------------------------------- helpers


def _when(item_id: str, start: datetime, end: datetime) -> datetime:
    """A stable minute in `[start, end)` picked by the item id (or a fixed override)."""
    fixed = _FIXED_TIMES.get(item_id)
    if fixed is not None:
        return fixed
    digest = hashlib.sha256(item_id.encode("utf-8")).digest()
    span = int((end - start).total_seconds() // 60)
    return start + timedelta(minutes=int.from_bytes(digest[:8], "big") % span)


def _key(label: str) -> str:
    """A value key: lowercase ASCII with German letters spelled out ("Küche" -> "kueche")."""
    folded = label.lower()
    for src, dst in (("ä", "ae"), ("ö", "oe"), ("ü", "ue"), ("ß", "ss")):
        folded = folded.replace(src, dst)
    chars = [c if c.isascii() and c.isalnum() else "_" for c in folded]
    return "_".join(part for part in "".join(chars).split("_") if part)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _tags(text: str) -> list[str]:
    return [tag.strip() for tag in text.split(",") if tag.strip()]


def _month(moment: datetime, lang: str) -> str:
    names = _MONTHS_DE if lang == "de" else _MONTHS_EN
    return f"{names[moment.month - 1]} {moment.year}"


def _record(
    namespace: str,
    kind: str,
    item_id: str,
    *,
    schema: str,
    payload: dict[str, Any],
    title: str,
    tags: Sequence[str],
    ring: str,
    lang: str,
    category: str,
    person: str,
    visibility: Iterable[str],
    updated_at: datetime,
    galaxy: str = "default",
    facets: Mapping[str, str] | None = None,
) -> Record:
    metadata = RecordMetadata.model_validate(
        {
            "status": payload["status"],
            "updated_at": updated_at,
            "visibility": list(visibility),
            "lang": lang,
            "category": category,
            "person": person,
            **(facets or {}),
        }
    )
    return Record(
        namespace=namespace,
        snapshot_kind=kind,
        item_id=item_id,
        revision=2 if item_id in _REVISED else 1,
        galaxy=galaxy,
        ring=ring,
        payload_schema=schema,
        payload=payload,
        text=RecordText(title=title, body=str(payload["summary"]), tags=list(tags)),
        metadata=metadata,
    )


def _object_payload(
    item_id: str, kind: str, summary: str, status: str, slot_key: str, value_key: str
) -> dict[str, Any]:
    return {
        "memory_id": item_id,
        "kind": kind,
        "summary": summary,
        "status": status,
        "slot_key": slot_key,
        "value_key": value_key,
    }


# --------------------------------------------------------------- places and things


class _Place(NamedTuple):
    room: str
    label_de: str
    label_en: str
    at_de: str
    at_en: str


_ROOMS: Mapping[str, tuple[str, str]] = {
    "kitchen": ("Küche", "kitchen"),
    "hall": ("Flur", "hall"),
    "living_room": ("Wohnzimmer", "living room"),
    "bedroom": ("Schlafzimmer", "bedroom"),
    "bathroom": ("Bad", "bathroom"),
    "study": ("Arbeitszimmer", "study"),
    "cellar": ("Keller", "cellar"),
    "garden": ("Garten", "garden"),
    "utility": ("Abstellkammer", "utility room"),
    "attic": ("Dachboden", "attic"),
    "guest_room": ("Gästezimmer", "guest room"),
    "garage": ("Garage", "garage"),
}

_P = _Place
_PLACES: Mapping[str, _Place] = {
    "hall_cupboard": _P("hall", "Flurschrank", "hall cupboard", "im Flurschrank",
                        "in the hall cupboard"),
    "kitchen_shelf": _P("kitchen", "Küchenregal", "kitchen shelf", "im Küchenregal",
                        "on the kitchen shelf"),
    "bedside_table": _P("bedroom", "Nachttisch", "bedside table", "auf dem Nachttisch",
                        "on the bedside table"),
    "hall_chest": _P("hall", "Flurkommode", "hall chest",
                     "in der obersten Schublade der Flurkommode",
                     "in the top drawer of the hall chest"),
    "key_rack": _P("hall", "Schlüsselbrett", "key rack", "am Schlüsselbrett neben der Haustür",
                   "on the key rack by the front door"),
    "coat_rack": _P("hall", "Garderobe", "coat rack", "an der Garderobe", "by the coat rack"),
    "sofa": _P("living_room", "Sofa", "sofa", "neben dem Sofa im Wohnzimmer",
               "next to the sofa in the living room"),
    "living_cabinet": _P("living_room", "Wohnzimmerschrank", "living room cabinet",
                         "im Wohnzimmerschrank hinter der Glastür",
                         "in the living room cabinet behind the glass door"),
    "writing_desk": _P("study", "Sekretär", "writing desk", "im Sekretär im Arbeitszimmer",
                       "in the writing desk in the study"),
    "important_folder": _P("study", "Ordner „Wichtiges“", "'Important' folder",
                           "im blauen Ordner „Wichtiges“ im Arbeitszimmer",
                           "in the blue 'Important' folder in the study"),
    "bathroom_cabinet": _P("bathroom", "Spiegelschrank", "bathroom cabinet",
                           "im Spiegelschrank im Bad", "in the mirrored cabinet in the bathroom"),
    "utility_closet": _P("utility", "Abstellkammer", "utility closet",
                         "in der Abstellkammer neben dem Staubsauger",
                         "in the utility closet next to the vacuum cleaner"),
    "cellar_shelf": _P("cellar", "Kellerregal", "cellar shelf", "im Metallregal im Keller",
                       "on the metal shelf in the cellar"),
    "workbench": _P("cellar", "Werkbank", "workbench", "auf der Werkbank im Keller",
                    "on the workbench in the cellar"),
    "garden_shed": _P("garden", "Gartenhaus", "garden shed", "im Gartenhaus",
                      "in the garden shed"),
    "stove_drawer": _P("kitchen", "Herdschublade", "drawer by the stove",
                       "in der Schublade links vom Herd", "in the drawer left of the stove"),
    "pantry": _P("kitchen", "Speisekammer", "pantry", "in der Speisekammer", "in the pantry"),
    "wardrobe": _P("bedroom", "Kleiderschrank", "wardrobe", "oben im Kleiderschrank",
                   "on the top shelf of the wardrobe"),
    "charging_shelf": _P("hall", "Ladeablage", "charging shelf", "auf der Ladeablage im Flur",
                         "on the charging shelf in the hall"),
    "handbag": _P("hall", "Handtasche", "handbag", "in deiner braunen Handtasche",
                  "in your brown handbag"),
    "shoe_cabinet": _P("hall", "Schuhschrank", "shoe cabinet", "im Schuhschrank",
                       "in the shoe cabinet"),
    "attic": _P("attic", "Dachboden", "attic", "auf dem Dachboden in der grünen Kiste",
                "in the green box in the attic"),
    "guest_wardrobe": _P("guest_room", "Gästezimmerschrank", "guest room wardrobe",
                         "im Schrank im Gästezimmer", "in the wardrobe in the guest room"),
    "bookcase": _P("living_room", "Bücherregal", "bookcase",
                   "ganz unten im Bücherregal im Wohnzimmer",
                   "on the bottom shelf of the living room bookcase"),
    "tv_cabinet": _P("living_room", "Fernsehschrank", "TV cabinet",
                     "in der Schublade vom Fernsehschrank", "in the TV cabinet drawer"),
    "freezer": _P("kitchen", "Gefrierfach", "freezer", "im obersten Gefrierfach",
                  "in the top freezer drawer"),
    "glove_box": _P("garage", "Handschuhfach", "glove box", "im Handschuhfach vom Auto",
                    "in the car's glove box"),
    "garage_wall": _P("garage", "Werkzeugwand", "garage tool wall",
                      "in der Garage an der Werkzeugwand", "on the tool wall in the garage"),
    "windowsill": _P("kitchen", "Küchenfensterbank", "kitchen windowsill",
                     "auf der Fensterbank in der Küche", "on the kitchen windowsill"),
}  # fmt: skip


class _Thing(NamedTuple):
    """Something with a place. `alt` yields a conflict, `old` an archived location."""

    slug: str
    lang: str
    noun: str  # title form
    phrase: str  # sentence form, with article or possessive
    verb: str  # "liegt" / "stehen" / "is" / "are"
    place: str
    alt: str = ""
    old: str = ""
    vis: str = "family"


_THINGS: tuple[_Thing, ...] = (
    _Thing("reading_glasses", "en", "Reading glasses", "your reading glasses", "are",
           "bedside_table", alt="sofa"),
    _Thing("spare_house_key", "de", "Ersatzschlüssel", "der Ersatzschlüssel fürs Haus", "liegt",
           "hall_chest", old="shoe_cabinet"),
    _Thing("umbrella", "de", "Regenschirm", "dein großer schwarzer Regenschirm", "steht",
           "coat_rack"),
    _Thing("torch", "en", "Torch", "the torch", "is", "stove_drawer", alt="cellar_shelf"),
    _Thing("spare_batteries", "de", "Batterien", "die Ersatzbatterien", "liegen", "stove_drawer",
           alt="workbench"),
    _Thing("tv_remote", "en", "TV remote", "the TV remote", "is", "sofa", alt="tv_cabinet"),
    _Thing("blood_pressure_monitor", "de", "Blutdruckmessgerät", "das Blutdruckmessgerät",
           "liegt", "living_cabinet", old="bathroom_cabinet"),
    _Thing("sewing_box", "de", "Nähkästchen", "dein Nähkästchen", "steht", "guest_wardrobe"),
    _Thing("photo_albums", "en", "Photo albums", "the old photo albums", "are", "bookcase",
           alt="attic"),
    _Thing("passport", "de", "Reisepass", "dein Reisepass", "liegt", "important_folder",
           old="writing_desk", vis="private"),
    _Thing("health_insurance_card", "de", "Versichertenkarte", "deine Versichertenkarte",
           "steckt", "handbag", alt="writing_desk", vis="private"),
    _Thing("watering_can", "en", "Watering can", "the big green watering can", "is",
           "garden_shed"),
    _Thing("toolbox", "de", "Werkzeugkasten", "der blaue Werkzeugkasten", "steht", "workbench",
           alt="garage_wall"),
    _Thing("candles", "en", "Candles and matches", "the candles and matches", "are",
           "living_cabinet"),
    _Thing("hot_water_bottle", "de", "Wärmflasche", "die Wärmflasche", "liegt", "wardrobe"),
    _Thing("hearing_aid_batteries", "en", "Hearing aid batteries", "the hearing aid batteries",
           "are", "bathroom_cabinet", old="bedside_table"),
    _Thing("stamps", "de", "Briefmarken", "die Briefmarken", "liegen", "writing_desk"),
    _Thing("address_book", "en", "Address book", "your old address book", "is", "writing_desk",
           alt="hall_chest"),
    _Thing("phone_charger", "de", "Handy-Ladekabel", "das Ladekabel fürs Handy", "liegt",
           "charging_shelf", alt="bedside_table"),
    _Thing("shopping_trolley", "en", "Shopping trolley", "the shopping trolley", "is",
           "utility_closet"),
    _Thing("winter_boots", "de", "Winterstiefel", "deine gefütterten Winterstiefel", "stehen",
           "shoe_cabinet", old="cellar_shelf"),
    _Thing("iron", "en", "Iron", "the iron", "is", "utility_closet"),
    _Thing("spare_fuses", "de", "Ersatzsicherungen", "die Ersatzsicherungen", "liegen",
           "cellar_shelf"),
    _Thing("christmas_decorations", "en", "Christmas decorations", "the Christmas decorations",
           "are", "attic"),
    _Thing("pruning_shears", "de", "Gartenschere", "die Gartenschere", "hängt", "garden_shed",
           alt="garage_wall"),
    _Thing("fever_thermometer", "en", "Fever thermometer", "the fever thermometer", "is",
           "bathroom_cabinet"),
    _Thing("springform", "de", "Springform", "die Springform", "steht", "pantry",
           old="cellar_shelf"),
    _Thing("coffee_filters", "en", "Coffee filters", "the coffee filters", "are", "pantry"),
    _Thing("recipe_book", "de", "Rezeptbuch", "dein handgeschriebenes Rezeptbuch", "steht",
           "kitchen_shelf"),
    _Thing("car_key", "en", "Car key", "the car key", "is", "key_rack", alt="handbag"),
    _Thing("hi_vis_vest", "de", "Warnweste", "die Warnweste", "liegt", "glove_box"),
    _Thing("ice_scraper", "en", "Ice scraper", "the ice scraper", "is", "glove_box",
           alt="garage_wall"),
    _Thing("guest_bed_linen", "de", "Gästebettwäsche", "die Gästebettwäsche", "liegt",
           "guest_wardrobe"),
    _Thing("vacuum_bags", "en", "Vacuum cleaner bags", "the vacuum cleaner bags", "are",
           "utility_closet"),
    _Thing("jewellery_box", "de", "Schmuckkästchen", "dein Schmuckkästchen", "steht",
           "wardrobe", vis="private"),
    _Thing("pension_documents", "en", "Pension documents", "your pension documents", "are",
           "important_folder", old="writing_desk", vis="private"),
    _Thing("cat_food", "de", "Katzenfutter", "das Katzenfutter für Minka", "steht", "pantry"),
    _Thing("bird_seed", "en", "Bird seed", "the bird seed", "is", "garden_shed"),
    _Thing("folding_ruler", "de", "Zollstock", "der Zollstock", "liegt", "workbench"),
    _Thing("magnifier", "en", "Magnifying glass", "the magnifying glass", "is", "sofa",
           alt="bedside_table"),
    _Thing("wool_blanket", "de", "Wolldecke", "die karierte Wolldecke", "liegt", "sofa"),
    _Thing("ice_packs", "en", "Ice packs", "the ice packs", "are", "freezer"),
    _Thing("herb_scissors", "de", "Kräuterschere", "die kleine Kräuterschere", "liegt",
           "windowsill"),
)  # fmt: skip

_LOCATED = {
    "de": (
        "{Phrase} {verb} {at}.",
        "{At} {verb} {phrase}.",
        "{Phrase} {verb} meistens {at}.",
        "Du hast mir gesagt, {phrase} {verb} ab jetzt {at}.",
        "Zur Erinnerung: {Phrase} {verb} {at}.",
    ),
    "en": (
        "{Phrase} {verb} {at}.",
        "You keep {phrase} {at}.",
        "{Phrase} {verb} usually {at}.",
        "From now on you keep {phrase} {at}.",
        "Reminder: {phrase} {verb} {at}.",
    ),
}
_LOCATED_BEFORE = {
    "de": "Bis {month} {verb} {phrase} {at}.",
    "en": "Until {month}, {phrase} {verb} {at}.",
}
_LOCATION_CLASH = {
    "de": (
        "Widersprüchliche Angaben: {Phrase} {verb} entweder {at_a} oder {at_b}. Bitte nachfragen.",
        "Zwei Erinnerungen passen nicht zusammen – {phrase} {verb} laut der einen {at_a}, "
        "laut der anderen {at_b}.",
    ),
    "en": (
        "Conflicting notes: {phrase} {verb} either {at_a} or {at_b}. Worth asking.",
        "Two memories disagree – one says {phrase} {verb} {at_a}, the other {at_b}.",
    ),
}
_PAST = {
    "liegt": "lag", "liegen": "lagen", "steht": "stand", "stehen": "standen",
    "hängt": "hing", "hängen": "hingen", "steckt": "steckte", "ist": "war",
    "is": "was", "are": "were",
}  # fmt: skip

_RESOLUTION_STATUS = {
    "open": "active",
    "detected": "candidate",
    "pending_confirmation": "uncertain",
    "resolved": "archived",
}
_LOCATION_RESOLUTIONS = ("open", "pending_confirmation", "resolved")


def _place_label(place: _Place, lang: str) -> str:
    return place.label_de if lang == "de" else place.label_en


def _place_at(place: _Place, lang: str) -> str:
    return place.at_de if lang == "de" else place.at_en


def _location_tags(thing: _Thing, place: _Place) -> list[str]:
    room_de, room_en = _ROOMS[place.room]
    room = room_de if thing.lang == "de" else room_en
    return [thing.noun.lower(), _place_label(place, thing.lang).lower(), room.lower()]


def _location_resolution(thing: _Thing) -> str:
    with_alt = [t.slug for t in _THINGS if t.alt]
    return _LOCATION_RESOLUTIONS[with_alt.index(thing.slug) % len(_LOCATION_RESOLUTIONS)]


def _location_facts(namespace: str, successors: frozenset[str]) -> list[Record]:
    records = [_thermos_old(namespace), _thermos_current(namespace)]
    for index, thing in enumerate(_THINGS):
        place = _PLACES[thing.place]
        item_id = f"fact:{thing.slug}_location"
        template = _LOCATED[thing.lang][index % len(_LOCATED[thing.lang])]
        at = _place_at(place, thing.lang)
        summary = template.format(
            Phrase=_cap(thing.phrase), phrase=thing.phrase, verb=thing.verb, At=_cap(at), at=at
        )
        if thing.alt and _location_resolution(thing) != "resolved":
            status = "uncertain"
        elif index % 7 == 5:
            status = "candidate"
        else:
            status = "active"
        start = _SUCCESSOR_START if item_id in successors else _START
        records.append(
            _record(
                namespace,
                "objects",
                item_id,
                schema=OBJECT_SCHEMA,
                payload=_object_payload(
                    item_id, "fact", summary, status, f"location:{thing.slug}", thing.place
                ),
                title=f"{thing.noun} – {_place_label(place, thing.lang)}",
                tags=_location_tags(thing, place),
                ring=f"home/{place.room}",
                lang=thing.lang,
                category="location",
                person="margarete",
                visibility=[thing.vis],
                updated_at=_when(item_id, start, _END),
                facets={"room": place.room},
            )
        )
    return records


def _thermos_old(namespace: str) -> Record:
    item_id = "fact:thermos_location_old"
    summary = "Früher stand deine rote Thermoskanne im Flurschrank."
    return _record(
        namespace,
        "objects",
        item_id,
        schema=OBJECT_SCHEMA,
        payload=_object_payload(
            item_id, "fact", summary, "active", "location:thermos", "flurschrank"
        ),
        title="Rote Thermoskanne – früher Flurschrank",
        tags=["thermoskanne", "flurschrank", "flur"],
        ring="home/hall",
        lang="de",
        category="location",
        person="margarete",
        visibility=["family"],
        updated_at=_when(item_id, _START, _END),
        facets={"room": "hall"},
    )


def _thermos_current(namespace: str) -> Record:
    item_id = "fact:thermos_location_current"
    summary = "Deine rote Thermoskanne steht jetzt im Küchenregal, gleich neben den Teedosen."
    return _record(
        namespace,
        "objects",
        item_id,
        schema=OBJECT_SCHEMA,
        payload=_object_payload(
            item_id, "fact", summary, "active", "location:thermos", "kuechenregal"
        ),
        title="Rote Thermoskanne – Küchenregal",
        tags=["thermoskanne", "küchenregal", "küche"],
        ring="home/kitchen",
        lang="de",
        category="location",
        person="margarete",
        visibility=["family"],
        updated_at=_when(item_id, _START, _END),
        facets={"room": "kitchen"},
    )


# ------------------------------------------------------------------------ preferences


class _Person(NamedTuple):
    name: str
    male: bool
    galaxy: str = "default"


_PEOPLE: Mapping[str, _Person] = {
    "margarete": _Person("Margarete", False),
    "anna": _Person("Anna", False, "anna"),
    "thomas": _Person("Thomas", True, "anna"),
    "lukas": _Person("Lukas", True),
    "mia": _Person("Mia", False),
    "ingrid": _Person("Ingrid", False),
    "yilmaz": _Person("Herr Yilmaz", True),
}

# category -> (German template, English template, German title, English title)
_PREFERENCE_KINDS: Mapping[str, tuple[str, str, str, str]] = {
    "coffee": ("{n} trinkt {sein} Kaffee am liebsten {v}.", "{n} takes {his} coffee {v}.",
               "Kaffee", "Coffee"),
    "evening_drink": ("Abends trinkt {n} gern {v}.",
                      "In the evening {n} likes a cup of {v}.", "Abendgetränk", "Evening drink"),
    "music": ("{n} hört am liebsten {v}.", "{ns} favourite music: {v}.", "Lieblingsmusik",
              "Favourite music"),
    "tv": ("Im Fernsehen schaut {n} am liebsten {v}.", "On TV, {n} prefers {v}.", "Fernsehen",
           "TV"),
    "dislike": ("{n} mag {v} überhaupt nicht.", "{n} really doesn't like {v}.", "Mag nicht",
                "Dislikes"),
    "allergy": ("Achtung: {n} ist allergisch gegen {v}.", "Careful: {n} is allergic to {v}.",
                "Allergie", "Allergy"),
    "flowers": ("Über {v} freut sich {n} immer am meisten.", "{ns} favourite flowers are {v}.",
                "Lieblingsblumen", "Favourite flowers"),
    "reading": ("{n} liest gerade {v}.", "{n} is currently reading {v}.", "Lektüre", "Reading"),
    "wakeup": ("{n} möchte morgens mit {v} geweckt werden.",
               "{n} wants to be woken up with {v}.", "Wecken", "Wake-up"),
    "address": ("{n} möchte {v} angesprochen werden.", "{n} prefers to be addressed {v}.",
                "Anrede", "Form of address"),
    "dessert": ("Zum Nachtisch freut sich {n} über {v}.", "For dessert, {n} loves {v}.",
                "Nachtisch", "Dessert"),
    "gift": ("Als Geschenk wünscht sich {n} {v}.", "{n} would love {v} as a present.",
             "Geschenkidee", "Gift idea"),
    "hobby": ("In der Freizeit ist {n} am liebsten {v}.", "In {his} free time {n} loves {v}.",
              "Hobby", "Hobby"),
    "radio": ("Morgens läuft bei {n} am liebsten {v}.", "In the mornings {n} listens to {v}.",
              "Radio", "Radio"),
}  # fmt: skip

# (person, category, language, value)
_PREFERENCES: tuple[tuple[str, str, str, str], ...] = (
    ("margarete", "coffee", "de", "schwarz mit einem Stück Zucker"),
    ("thomas", "coffee", "en", "white, with plenty of milk and no sugar"),
    ("anna", "coffee", "de", "als Flat White mit Hafermilch"),
    ("margarete", "evening_drink", "de", "einen Pfefferminztee mit einem Löffel Honig"),
    ("anna", "evening_drink", "en", "rooibos tea"),
    ("margarete", "music", "de", "Schlager von Roy Black und Peter Alexander"),
    ("lukas", "music", "en", "video game soundtracks and a bit of rap"),
    ("anna", "music", "en", "Fleetwood Mac and old Motown records"),
    ("margarete", "tv", "de", "Rosamunde-Pilcher-Filme und das Quiz am Vorabend"),
    ("thomas", "tv", "en", "football, above all Leeds United matches"),
    ("mia", "tv", "en", "the Sendung mit der Maus on Sunday mornings"),
    ("margarete", "dislike", "de", "Koriander und alles, was sehr scharf ist,"),
    ("mia", "dislike", "en", "mushrooms, even tiny pieces in a sauce"),
    ("ingrid", "dislike", "en", "phone calls before ten in the morning"),
    ("lukas", "allergy", "de", "Haselnüsse – auch Spuren davon, also kein Nutella im Haus"),
    ("thomas", "allergy", "en", "penicillin"),
    ("margarete", "flowers", "de", "Pfingstrosen aus dem eigenen Garten"),
    ("anna", "flowers", "de", "weiße Tulpen"),
    ("ingrid", "flowers", "en", "freesias, ideally yellow ones"),
    ("margarete", "reading", "de", "einen Venedig-Krimi von Donna Leon"),
    ("thomas", "reading", "en", "a biography of Brian Clough"),
    ("margarete", "wakeup", "de", "leiser Klaviermusik und nicht vor halb acht"),
    ("anna", "wakeup", "en", "the news headlines at 6:15"),
    ("margarete", "address", "de", "mit Vornamen und per Du"),
    ("yilmaz", "address", "en", "formally, as Mr Yilmaz"),
    ("mia", "dessert", "de", "Schokopudding mit Sahne"),
    ("lukas", "dessert", "en", "waffles with hot cherries"),
    ("margarete", "dessert", "de", "Rote Grütze mit Vanillesoße"),
    ("mia", "gift", "en", "a book about horses"),
    ("lukas", "gift", "de", "ein Lego-Technic-Modell, am liebsten einen Kran"),
    ("thomas", "hobby", "en", "fishing on the Elbe with his old rod"),
    ("margarete", "hobby", "de", "im Garten oder beim Skatabend mit Frau Becker"),
    ("ingrid", "hobby", "de", "mit dem Fahrrad an der Trave unterwegs"),
    ("margarete", "radio", "de", "NDR 1 Welle Nord mit den Nachrichten um acht"),
)


def _possessive_en(name: str) -> str:
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def _preference_facts(namespace: str) -> list[Record]:
    records = []
    for index, (person_key, category, lang, value) in enumerate(_PREFERENCES):
        person = _PEOPLE[person_key]
        de_template, en_template, de_title, en_title = _PREFERENCE_KINDS[category]
        template = de_template if lang == "de" else en_template
        summary = template.format(
            n=person.name,
            ns=_possessive_en(person.name),
            sein="seinen" if person.male else "ihren",
            his="his" if person.male else "her",
            v=value,
        )
        title = f"{person.name}: {de_title if lang == 'de' else en_title}"
        item_id = f"fact:pref_{person_key}_{category}"
        status = "candidate" if index % 9 == 4 else "active"
        sensitive = category == "allergy" and person_key == "thomas"
        records.append(
            _record(
                namespace,
                "objects",
                item_id,
                schema=OBJECT_SCHEMA,
                payload=_object_payload(
                    item_id,
                    "preference",
                    summary,
                    status,
                    f"preference:{person_key}:{category}",
                    _key(value)[:48].rstrip("_"),
                ),
                title=title,
                tags=[(de_title if lang == "de" else en_title).lower(), person.name.lower()],
                ring="people/family" if person_key != "yilmaz" else "people/neighbours",
                lang=lang,
                category="preference",
                person=person_key,
                visibility=["private"] if sensitive else ["family"],
                updated_at=_when(item_id, _START, _END),
                galaxy=person.galaxy,
            )
        )
    return records


# ---------------------------------------------------------------- hand-written notes


class _Note(NamedTuple):
    slug: str
    lang: str
    title: str
    body: str
    tags: str  # comma-separated
    person: str = "margarete"
    status: str = "active"
    galaxy: str = "default"
    ring: str = ""
    vis: str = ""  # space-separated; empty = the group's default


class _Group(NamedTuple):
    category: str
    kind: str
    ring: str
    vis: str
    notes: tuple[_Note, ...]


_N = _Note
_GROUPS: tuple[_Group, ...] = (
    _Group("routine", "routine", "routines/daily", "family", (
        _N("morning_walk", "de", "Morgenspaziergang",
           "Jeden Morgen gegen neun gehst du eine Runde um den Teich im Stadtpark, wenn es "
           "nicht regnet.", "spaziergang, morgen, stadtpark"),
        _N("herb_watering", "en", "Watering the herbs",
           "Every other morning you water the basil and chives on the kitchen windowsill "
           "before breakfast.", "herbs, watering, kitchen"),
        _N("sunday_call_anna", "de", "Sonntagsanruf",
           "Sonntags gegen 18 Uhr ruft Anna an; dann soll Twinr keine Erinnerungen "
           "dazwischenschieben.", "anna, anruf, sonntag"),
        _N("skat_evening", "de", "Skatabend",
           "Jeden zweiten Donnerstag ist Skatabend bei Frau Becker in der Lindenstraße, "
           "Beginn 19 Uhr.", "skat, frau becker, donnerstag", ring="people/friends"),
        _N("market_saturday", "en", "Saturday market",
           "On Saturdays you go to the weekly market on the Marktplatz for eggs, cheese and "
           "flowers.", "market, saturday, shopping"),
        _N("afternoon_nap", "de", "Mittagsruhe",
           "Nach dem Mittagessen hältst du bis etwa halb drei Mittagsruhe – bitte dann keine "
           "Durchsagen.", "mittagsruhe, ruhe, nachmittag"),
        _N("evening_news", "en", "Evening news",
           "At eight every evening you watch the Tagesschau, so the TV should already be on "
           "channel one.", "news, tagesschau, evening"),
        _N("blood_pressure_check", "en", "Blood pressure log",
           "Every morning before breakfast you measure your blood pressure and write the "
           "values in the little booklet.", "blood pressure, log, morning",
           ring="health/routines", vis="private"),
        _N("bin_day", "en", "Bin day",
           "The grey bin goes out on Tuesday evenings; the yellow recycling bags every second "
           "Friday.", "bins, rubbish, tuesday"),
        _N("church_sunday", "de", "Gottesdienst",
           "Sonntags um zehn gehst du zum Gottesdienst in St. Marien; Herr Yilmaz fährt dich, "
           "wenn es glatt ist.", "gottesdienst, sonntag, st. marien"),
        _N("physio_exercises", "en", "Knee exercises",
           "Every evening you do the ten-minute knee exercises Jonas from physiotherapy "
           "showed you.", "physiotherapy, knee, exercises", ring="health/routines",
           status="candidate"),
        _N("crossword", "de", "Kreuzworträtsel",
           "Zum Nachmittagskaffee löst du das Kreuzworträtsel aus der Fernsehzeitung.",
           "kreuzworträtsel, kaffee, nachmittag"),
        _N("lukas_homework", "en", "Lukas's homework afternoons",
           "On Wednesdays Lukas comes over after school and does his homework at the dining "
           "table until Anna picks him up at five.", "lukas, homework, wednesday",
           person="lukas"),
        _N("anna_plant_watering", "en", "Plant watering",
           "When Margarete is away, Anna waters the house plants on Mondays and Thursdays.",
           "plants, watering, holiday", person="anna", galaxy="anna"),
        _N("bedtime", "de", "Schlafenszeit",
           "Gegen 22 Uhr gehst du ins Bett; Twinr soll dann das Flurlicht auf 10 Prozent "
           "dimmen.", "schlafen, abend, flurlicht"),
    )),
    _Group("appointment", "appointment", "health/appointments", "family", (
        _N("dentist_checkup", "de", "Zahnarzt Dr. Sommer",
           "Kontrolltermin bei Zahnärztin Dr. Sommer am 12. November 2026 um 10:15 Uhr, "
           "Praxis Am Markt 3.", "zahnarzt, termin, kontrolle"),
        _N("eye_doctor", "en", "Eye doctor",
           "Appointment with the ophthalmologist on 18 November 2026 at 9:40; bring your "
           "current glasses and don't drive afterwards.", "eye doctor, appointment, glasses"),
        _N("gp_bloodwork", "de", "Blutabnahme Hausarzt",
           "Blutabnahme bei Dr. Weber am 4. Dezember 2026 um 8 Uhr – nüchtern kommen, nichts "
           "frühstücken.", "hausarzt, blutabnahme, nüchtern", vis="private"),
        _N("hairdresser", "en", "Hairdresser",
           "Hairdresser at Salon Schneider on 21 November 2026 at 2 pm – wash, cut and set as "
           "usual.", "hairdresser, salon, appointment", ring="people/services"),
        _N("physio_series", "de", "Physiotherapie Knie",
           "Sechs Termine Krankengymnastik bei Jonas, immer dienstags um 11 Uhr, noch bis "
           "Mitte Dezember.", "physiotherapie, knie, dienstag"),
        _N("mia_school_play", "en", "Mia's school play",
           "Mia's school play is on 27 November 2026 at 6 pm in the school hall; she plays "
           "the fox.", "mia, school play, theatre", person="mia", status="candidate",
           ring="people/family"),
        _N("chimney_sweep", "de", "Schornsteinfeger",
           "Der Schornsteinfeger kommt am 9. November 2026 zwischen 8 und 12 Uhr; der Keller "
           "muss zugänglich sein.", "schornsteinfeger, keller, termin",
           ring="home/maintenance"),
        _N("boiler_service", "en", "Boiler service",
           "The annual boiler service is booked for 3 December 2026; the engineer will ring "
           "the bell around 10.", "boiler, service, heating", ring="home/maintenance"),
        _N("ingrid_visit", "de", "Besuch von Ingrid",
           "Deine Schwester Ingrid kommt vom 19. bis 22. Dezember 2026 aus Lübeck und schläft "
           "im Gästezimmer.", "ingrid, besuch, gästezimmer", person="ingrid",
           status="uncertain", ring="people/family"),
        _N("bruno_vet", "en", "Bruno at the vet",
           "Bruno's annual vaccination at the vet in Eppendorf is on 14 November 2026 at "
           "4:30 pm.", "bruno, vet, vaccination", person="anna", galaxy="anna", ring="pets"),
        _N("parents_evening", "en", "Parents' evening",
           "Parents' evening at Lukas's school is on 25 November 2026 at 7 pm; Thomas is "
           "going too.", "parents' evening, lukas, school", person="anna", galaxy="anna",
           ring="people/family"),
        _N("hearing_aid_check", "de", "Hörgeräteakustiker",
           "Hörgeräte-Kontrolle beim Akustiker in der Bahnhofstraße am 30. November 2026 um "
           "15 Uhr.", "hörgerät, akustiker, termin"),
        _N("foot_care", "en", "Foot care",
           "Medical foot care every six weeks; the next home visit is on 16 November 2026 at "
           "11:30.", "podiatrist, foot care, home visit"),
        _N("tax_help", "de", "Lohnsteuerhilfe",
           "Termin bei der Lohnsteuerhilfe am 8. Dezember 2026 um 14 Uhr; Rentenbescheid und "
           "Belege mitnehmen.", "steuer, rentenbescheid, termin", ring="household/finance",
           vis="private"),
    )),
    _Group("medication", "reminder", "health/medication", "private", (
        _N("med_ramipril", "de", "Blutdrucktabletten morgens",
           "Deine Blutdrucktabletten nimmst du jeden Morgen nach dem Frühstück: eine Tablette "
           "Ramipril 5 mg mit einem Glas Wasser.", "blutdrucktabletten, ramipril, morgens"),
        _N("med_metformin", "en", "Metformin",
           "Take one metformin 500 mg with lunch and one with dinner, always with food.",
           "metformin, diabetes, meals"),
        _N("med_vitamin_d", "de", "Vitamin D",
           "Sonntags gibt es eine Vitamin-D-Kapsel mit 20.000 Einheiten – einmal pro Woche, "
           "nicht öfter.", "vitamin d, sonntag, kapsel"),
        _N("med_eye_drops", "en", "Eye drops",
           "Glaucoma eye drops: one drop in each eye at 9 pm; the bottle is kept in the "
           "fridge door.", "eye drops, glaucoma, evening"),
        _N("med_pantoprazole", "de", "Magenschutz",
           "Pantoprazol nimmst du eine halbe Stunde vor dem Frühstück, auf nüchternen Magen.",
           "pantoprazol, magen, nüchtern"),
        _N("med_painkillers", "en", "Painkillers",
           "Dr. Weber said to avoid ibuprofen because of your heart medication; paracetamol "
           "is fine for the knee.", "ibuprofen, paracetamol, knee"),
        _N("med_pill_organiser", "de", "Tablettendose",
           "Die Wochen-Tablettendose füllst du sonntags nach dem Gottesdienst für die ganze "
           "Woche auf.", "tablettendose, sonntag, wochenplan", vis="family"),
        _N("med_prescription_refill", "en", "Prescription refill",
           "The metformin prescription runs out in mid-December; ask Dr. Weber's practice "
           "for a new one by phone.", "prescription, metformin, pharmacy",
           status="candidate"),
        _N("med_hay_fever", "en", "Hay fever tablets",
           "Anna takes cetirizine in spring once the birch pollen starts, one tablet in the "
           "evening.", "cetirizine, hay fever, spring", person="anna", galaxy="anna"),
        _N("med_knee_gel", "de", "Knie-Salbe",
           "Die Diclofenac-Salbe trägst du zweimal täglich dünn aufs rechte Knie auf, morgens "
           "und abends.", "salbe, knie, diclofenac"),
    )),
    _Group("device", "setting", "devices/home", "family", (
        _N("heating_night_setback", "en", "Night setback",
           "The living room thermostat turns the heating down to 17 °C at night from 10 pm "
           "and back up to 21 °C at 6:30.", "thermostat, heating, night",
           ring="devices/heating"),
        _N("heating_bathroom", "de", "Badheizung",
           "Die Heizung im Bad läuft morgens von 6 bis 8 Uhr auf 23 Grad, damit es beim "
           "Duschen warm ist.", "heizung, bad, morgens", ring="devices/heating"),
        _N("tv_favourites", "de", "Fernsehsender",
           "Auf der Fernbedienung liegt das Erste auf Taste 1, das ZDF auf 2 und der NDR "
           "auf 3.", "fernseher, sender, fernbedienung", ring="devices/media"),
        _N("twinr_volume", "en", "Twinr volume",
           "Twinr speaks at volume 7 during the day and drops to 4 after 9 pm.",
           "twinr, volume, speaker", ring="devices/twinr"),
        _N("twinr_speed", "de", "Sprechtempo",
           "Twinr soll etwas langsamer sprechen als normal – Tempo 0,85 gefällt dir am "
           "besten.", "twinr, sprechtempo, stimme", ring="devices/twinr",
           status="candidate"),
        _N("hearing_aid_programs", "en", "Hearing aid programs",
           "Hearing aids: program 1 is for everyday, program 2 for restaurants, and the TV "
           "streamer uses program 3.", "hearing aids, programs, tv", ring="devices/media"),
        _N("doorbell_light", "de", "Türklingel-Licht",
           "Wenn es klingelt, blinkt zusätzlich die Lampe im Wohnzimmer, weil du die Klingel "
           "manchmal nicht hörst.", "türklingel, lampe, blinken"),
        _N("guest_wifi", "en", "Guest Wi-Fi",
           "The guest Wi-Fi is called 'Gartenblick-Gast'; the password card is pinned to the "
           "fridge.", "wifi, guests, password", ring="devices/network", vis="family guests"),
        _N("washing_machine", "de", "Waschmaschine",
           "Für Bettwäsche nimmst du an der Waschmaschine das Programm Baumwolle 60 Grad mit "
           "Extra-Spülen.", "waschmaschine, bettwäsche, programm"),
        _N("radio_alarm", "en", "Radio alarm",
           "The kitchen radio switches itself on at 7:30 with NDR 1; the snooze button is the "
           "big one on top.", "radio, alarm, kitchen", ring="devices/media"),
        _N("hall_light_sensor", "de", "Flurlicht",
           "Das Flurlicht geht nachts über den Bewegungsmelder an, aber nur gedimmt auf 10 "
           "Prozent.", "flurlicht, bewegungsmelder, nacht", ring="devices/lighting"),
        _N("emergency_button", "en", "Emergency button",
           "The red emergency button on your wristband calls the Johanniter service; test it "
           "on the first of each month.", "emergency, wristband, johanniter",
           ring="health/safety"),
        _N("phone_speed_dial", "de", "Kurzwahl",
           "Am Festnetztelefon ist Anna auf Kurzwahl 1, Herr Yilmaz auf 2 und die Praxis "
           "Dr. Weber auf 3.", "telefon, kurzwahl, festnetz", ring="devices/phone"),
        _N("anna_car_charging", "en", "Car charging",
           "Anna's electric car charges at the wallbox in the carport overnight, limited to "
           "80 percent.", "car, wallbox, charging", person="anna", galaxy="anna",
           ring="devices/car"),
        _N("blinds_timer", "de", "Rollläden",
           "Die Rollläden im Wohnzimmer gehen um 7:45 Uhr hoch und bei Sonnenuntergang "
           "automatisch runter.", "rollläden, zeitschaltuhr, wohnzimmer"),
        _N("smoke_detectors", "en", "Smoke detectors",
           "The smoke detectors in the hall and bedroom got new batteries in March; the next "
           "check is due in March 2027.", "smoke detector, batteries, safety",
           ring="home/safety", status="uncertain"),
    )),
    _Group("garden", "fact", "garden", "family guests", (
        _N("tomatoes", "de", "Tomaten",
           "Die Tomaten am Südzaun sind die Sorte Harzfeuer; im Sommer brauchen sie jeden "
           "Abend Wasser.", "tomaten, harzfeuer, gießen"),
        _N("roses_pruning", "en", "Pruning the roses",
           "The climbing roses by the porch are cut back in early March, when the forsythia "
           "flowers.", "roses, pruning, march"),
        _N("peonies", "de", "Pfingstrosen",
           "Die Pfingstrosen im Beet vor dem Küchenfenster hat noch dein Mann Heinz "
           "gepflanzt; bitte nicht umsetzen.", "pfingstrosen, beet, heinz"),
        _N("lawn_mowing", "en", "Lawn mowing",
           "Emre, Herr Yilmaz's son, mows the lawn every second Saturday for 15 euros.",
           "lawn, emre, mowing"),
        _N("compost", "de", "Kompost",
           "Auf den Kompost hinten links dürfen Gemüsereste und Kaffeesatz, aber keine "
           "Zitrusschalen.", "kompost, kaffeesatz, garten"),
        _N("apple_tree", "en", "Apple tree",
           "The old Boskoop apple tree is ready to pick in early October; Anna takes the "
           "surplus to be pressed for juice.", "apple tree, boskoop, harvest"),
        _N("bird_feeder", "de", "Vogelhäuschen",
           "Das Vogelhäuschen am Fliederbusch füllst du von November bis März mit "
           "Sonnenblumenkernen.", "vogelhäuschen, winter, sonnenblumenkerne"),
        _N("rain_barrel", "en", "Rain barrel",
           "The rain barrel by the shed has to be emptied and turned over before the first "
           "frost.", "rain barrel, frost, shed", status="candidate"),
        _N("raised_bed", "de", "Hochbeet",
           "Im Hochbeet wachsen Salat, Radieschen und Schnittlauch; Schnecken hältst du mit "
           "Kaffeesatz fern.", "hochbeet, salat, schnecken"),
        _N("hedge_rule", "en", "Hedge cutting",
           "Between March and September the hedge may only be trimmed lightly because of "
           "nesting birds.", "hedge, nesting, rules"),
        _N("garden_bench", "de", "Gartenbank",
           "Die Gartenbank wird jedes Frühjahr mit Teakholzöl gestrichen; das Öl steht im "
           "Gartenhaus.", "gartenbank, teakholzöl, frühjahr"),
        _N("dahlias", "en", "Dahlia tubers",
           "The dahlia tubers are dug up after the first frost and stored in newspaper in the "
           "cellar.", "dahlias, tubers, cellar"),
    )),
    _Group("pet", "fact", "pets", "family", (
        _N("minka_feeding", "de", "Minka füttern",
           "Minka bekommt morgens um sieben und abends um sechs je ein halbes Schälchen "
           "Futter, dazu eine Handvoll Trockenfutter.", "minka, futter, katze"),
        _N("minka_vet", "de", "Minkas Tierärztin",
           "Minkas Tierärztin ist Dr. Albers im Kirchweg; die nächste Impfung ist im Februar "
           "2027 fällig.", "minka, tierärztin, impfung"),
        _N("minka_indoor", "de", "Minka bleibt drinnen",
           "Minka ist eine reine Wohnungskatze – die Terrassentür bitte nie offen stehen "
           "lassen!", "minka, wohnungskatze, terrassentür", vis="family guests"),
        _N("minka_litter", "en", "Litter tray",
           "Minka's litter tray is in the bathroom under the window; it gets cleaned every "
           "morning.", "minka, litter tray, bathroom"),
        _N("minka_renal_diet", "de", "Minkas Nierendiät",
           "Seit dem Sommer bekommt Minka wegen der Nieren nur noch Spezialfutter, keine "
           "Leckerlis mehr.", "minka, nieren, spezialfutter", status="uncertain"),
        _N("bruno_walks", "en", "Bruno's walks",
           "Bruno needs three walks a day; the long one is at lunchtime in Eppendorfer Park.",
           "bruno, walks, dog", person="anna", galaxy="anna"),
        _N("bruno_food", "en", "Bruno's food",
           "Bruno gets 300 g of dry food a day, split into two meals, and never chocolate or "
           "grapes.", "bruno, dog food, grapes", person="anna", galaxy="anna"),
        _N("bruno_sitter", "de", "Betreuung für Bruno",
           "Wenn Anna verreist, kann Bruno nicht zu Margarete – er und Minka vertragen sich "
           "nicht; dann hilft die Hundetagesstätte Pfotenglück.",
           "bruno, hundetagesstätte, urlaub", person="anna", galaxy="anna"),
        _N("hedgehog", "en", "Hedgehog visitor",
           "A hedgehog visits the garden at dusk; leave a shallow dish of water by the shed, "
           "never milk.", "hedgehog, garden, water", status="uncertain", ring="garden"),
        _N("pond_fish", "de", "Goldfische",
           "Die Goldfische im Teich werden ab Oktober nicht mehr gefüttert, bis das Wasser im "
           "Frühjahr wieder über 10 Grad hat.", "goldfische, teich, füttern", ring="garden"),
    )),
    _Group("recipe", "recipe", "recipes", "family guests", (
        _N("recipe_apple_cake", "de", "Versunkener Apfelkuchen",
           "Dein Rezept für versunkenen Apfelkuchen: 125 g Butter, 125 g Zucker, 3 Eier, "
           "200 g Mehl und 4 Boskoop-Äpfel, 45 Minuten bei 180 Grad.",
           "apfelkuchen, backen, rezept"),
        _N("recipe_lentil_soup", "en", "Lentil soup",
           "Margarete's lentil soup: brown lentils, carrots, celeriac and a smoked sausage, "
           "finished with a dash of vinegar.", "lentil soup, recipe, winter"),
        _N("recipe_potato_salad", "de", "Kartoffelsalat",
           "Kartoffelsalat nach Mutters Art: festkochende Kartoffeln, Brühe, Essig, Zwiebeln "
           "und Gurkenwasser – keine Mayonnaise.", "kartoffelsalat, brühe, essig"),
        _N("recipe_scones", "en", "Thomas's scones",
           "Thomas's scones: self-raising flour, cold butter and a splash of milk, 12 minutes "
           "at 220 °C; served with clotted cream.", "scones, baking, thomas",
           person="thomas", galaxy="anna"),
        _N("recipe_rote_gruetze", "de", "Rote Grütze",
           "Für die Rote Grütze kochst du Johannisbeeren, Himbeeren und Kirschen mit Sago "
           "auf; kalt mit Vanillesoße servieren.", "rote grütze, nachtisch, beeren"),
        _N("recipe_pancakes", "en", "Pancakes for Mia",
           "Mia's favourite pancakes are thin buttermilk ones with apple sauce and cinnamon "
           "sugar.", "pancakes, mia, apple sauce", person="mia"),
        _N("recipe_vanillekipferl", "de", "Vanillekipferl",
           "Vanillekipferl backst du immer am ersten Advent – mit Mandeln statt Haselnüssen, "
           "wegen Lukas' Allergie.", "vanillekipferl, advent, mandeln"),
        _N("recipe_green_sauce", "en", "Green sauce",
           "The green sauce needs seven herbs – borage, chervil, cress, parsley, burnet, "
           "sorrel and chives – with sour cream and boiled eggs.", "green sauce, herbs, eggs"),
        _N("recipe_goulash", "de", "Rindergulasch",
           "Rindergulasch schmort drei Stunden im Bräter; zum Schluss kommt ein Stück "
           "Zartbitterschokolade in die Soße.", "gulasch, bräter, rind"),
        _N("recipe_elderflower", "en", "Elderflower syrup",
           "Elderflower syrup: 30 flower heads, two lemons and 1 kg of sugar per litre of "
           "water, steeped for three days in the cellar.", "elderflower, syrup, june"),
    )),
    _Group("household", "fact", "household", "family", (
        _N("contact_yilmaz", "de", "Nachbar Herr Yilmaz",
           "Herr Yilmaz von nebenan hat einen Schlüssel für Notfälle und ist abends meist zu "
           "Hause.", "yilmaz, nachbar, notfallschlüssel", person="yilmaz",
           ring="people/neighbours"),
        _N("contact_gp", "en", "Family doctor",
           "Your GP is Dr. Weber at the Praxis am Wall; surgery hours are 8 to 12 plus "
           "Tuesday afternoons.", "dr. weber, gp, surgery hours", ring="health/contacts",
           vis="private"),
        _N("contact_becker", "de", "Freundin Hilde Becker",
           "Frau Becker (Hilde) wohnt in der Lindenstraße 14; ihr Geburtstag ist am 3. Juli.",
           "becker, freundin, geburtstag", person="becker", ring="people/friends"),
        _N("birthday_mia", "en", "Mia's birthday",
           "Mia's birthday is on 8 March; she turns nine in 2027.", "mia, birthday, march",
           person="mia", ring="people/family"),
        _N("birthday_lukas", "de", "Geburtstag von Lukas",
           "Lukas hat am 17. August Geburtstag und wünscht sich jedes Jahr einen "
           "Marmorkuchen.", "lukas, geburtstag, marmorkuchen", person="lukas",
           ring="people/family"),
        _N("birthday_anna", "en", "Anna's birthday",
           "Anna's birthday is on 29 September; she likes a phone call before she leaves for "
           "work.", "anna, birthday, september", person="anna", ring="people/family"),
        _N("wedding_anniversary", "de", "Hochzeitstag",
           "Dein Hochzeitstag mit Heinz ist der 14. Mai; an dem Tag möchtest du gern zu "
           "seinem Grab auf dem Riensberger Friedhof.", "hochzeitstag, heinz, friedhof",
           ring="people/family", vis="private"),
        _N("newspaper", "en", "Newspaper delivery",
           "The Weser-Kurier is in the letterbox by 6 am; Anna pauses the delivery whenever "
           "you are away.", "newspaper, delivery, weser-kurier"),
        _N("cleaning_help", "de", "Haushaltshilfe",
           "Frau Kowalski kommt freitags von 9 bis 12 Uhr zum Putzen; das Geld liegt im "
           "Umschlag auf der Kommode.", "putzhilfe, freitag, kowalski", person="kowalski",
           ring="home/help"),
        _N("grocery_delivery", "en", "Grocery delivery",
           "Groceries from the Edeka delivery service arrive on Thursdays between 2 and 4 pm; "
           "the order has to go in by Wednesday night.", "groceries, delivery, thursday"),
        _N("taxi_number", "de", "Taxi",
           "Für Fahrten zum Arzt rufst du Taxi Hansa an; die Nummer steht auf dem Zettel am "
           "Kühlschrank.", "taxi, arzt, kühlschrank"),
        _N("bank_branch", "en", "Bank",
           "Your bank is the Sparkasse branch on Lüneburger Straße; your advisor there is "
           "Mr Brandt.", "bank, sparkasse, advisor", ring="household/finance", vis="private"),
        _N("house_rules_shoes", "de", "Schuhe aus",
           "Im Haus bitte Schuhe ausziehen – Gästepantoffeln stehen im Korb neben der "
           "Haustür.", "gäste, schuhe, pantoffeln", vis="family guests"),
        _N("anna_workplace", "en", "Anna's work",
           "Anna works as a pharmacist at the Linden-Apotheke and does late shifts on "
           "Tuesdays and Thursdays.", "anna, pharmacist, late shifts", person="anna",
           galaxy="anna", ring="people/family"),
        _N("anna_address", "de", "Adresse von Anna",
           "Anna, Thomas und die Kinder wohnen in der Isestraße 41 in Hamburg-Eppendorf, "
           "dritter Stock.", "anna, adresse, hamburg", person="anna", galaxy="anna",
           ring="people/family"),
        _N("thomas_job", "en", "Thomas's job",
           "Thomas teaches English at a grammar school in Hamburg and is usually home by "
           "four.", "thomas, teacher, school", person="thomas", galaxy="anna",
           ring="people/family"),
        _N("lukas_football", "de", "Fußballtraining von Lukas",
           "Lukas hat montags und mittwochs Fußballtraining beim SC Victoria, von 16:30 bis "
           "18 Uhr.", "lukas, fußball, training", person="lukas", galaxy="anna",
           ring="people/family", status="uncertain"),
        _N("ingrid_phone", "en", "Reaching Ingrid",
           "Your sister Ingrid in Lübeck is best reached on her landline in the evenings; she "
           "rarely checks her mobile.", "ingrid, sister, landline", person="ingrid",
           ring="people/family"),
        _N("spare_glasses_repair", "de", "Ersatzbrille beim Optiker",
           "Deine Ersatzbrille ist beim Optiker in der Obernstraße zur Reparatur und ab dem "
           "10. November abholbereit.", "optiker, ersatzbrille, reparatur",
           status="candidate", ring="people/services"),
        _N("gas_meter", "en", "Gas meter",
           "The gas meter is in the cellar behind the left-hand door; the reading is due "
           "every January.", "gas meter, cellar, reading", ring="home/cellar"),
    )),
)  # fmt: skip


def _note_facts(namespace: str, successors: frozenset[str]) -> list[Record]:
    records = []
    for group in _GROUPS:
        for note in group.notes:
            item_id = f"fact:{note.slug}"
            start = _SUCCESSOR_START if item_id in successors else _START
            records.append(
                _record(
                    namespace,
                    "objects",
                    item_id,
                    schema=OBJECT_SCHEMA,
                    payload=_object_payload(
                        item_id,
                        group.kind,
                        note.body,
                        note.status,
                        f"{group.category}:{note.slug}",
                        _key(note.title),
                    ),
                    title=note.title,
                    tags=_tags(note.tags),
                    ring=note.ring or group.ring,
                    lang=note.lang,
                    category=group.category,
                    person=note.person,
                    visibility=(note.vis or group.vis).split(),
                    updated_at=_when(item_id, start, _END),
                    galaxy=note.galaxy,
                )
            )
    return records


# ------------------------------------------------------------------------- conflicts


class _Clash(NamedTuple):
    slug: str
    lang: str
    subject: str
    a: str
    b: str
    body: str
    tags: str
    ring: str
    a_ref: str = ""
    b_ref: str = ""
    resolution: str = "open"
    person: str = "margarete"
    galaxy: str = "default"
    vis: str = "family"


_C = _Clash
_CLASHES: tuple[_Clash, ...] = (
    _C("coffee_sugar", "de", "Kaffee", "schwarz mit Zucker", "mit Milch, ohne Zucker",
       "Du hast einmal gesagt, du trinkst den Kaffee schwarz mit Zucker; Anna meinte neulich, "
       "du nimmst inzwischen Milch und keinen Zucker mehr.", "kaffee, zucker, milch",
       "people/family", a_ref="fact:pref_margarete_coffee"),
    _C("lukas_football_day", "en", "Lukas's football training", "Monday and Wednesday",
       "Tuesday and Thursday",
       "Two notes disagree about Lukas's football training days: one says Mondays and "
       "Wednesdays, a newer message from Anna says Tuesdays and Thursdays.",
       "lukas, football, training", "people/family", a_ref="fact:lukas_football",
       person="lukas", galaxy="anna"),
    _C("dentist_date", "de", "Zahnarzttermin", "12. November", "19. November",
       "Der Kontrolltermin bei Dr. Sommer steht einmal am 12. und einmal am 19. November im "
       "Kalender – die Praxis sollte das bestätigen.", "zahnarzt, termin, november",
       "health/appointments", a_ref="fact:dentist_checkup"),
    _C("ramipril_dose", "en", "Ramipril dose", "5 mg", "2.5 mg",
       "Your blood pressure tablet is noted as ramipril 5 mg, but the new pharmacy box says "
       "2.5 mg – check with Dr. Weber before changing anything.", "ramipril, dose, pharmacy",
       "health/medication", a_ref="fact:med_ramipril", resolution="pending_confirmation",
       vis="private"),
    _C("eye_drops_time", "de", "Augentropfen", "21 Uhr", "vor dem Schlafengehen",
       "Bei den Augentropfen steht einmal fest 21 Uhr, einmal „direkt vor dem Schlafengehen“ "
       "– das ist meist erst gegen 22 Uhr.", "augentropfen, uhrzeit, abend",
       "health/medication", a_ref="fact:med_eye_drops", resolution="resolved", vis="private"),
    _C("minka_food", "en", "Minka's food", "wet food twice a day", "renal diet only",
       "Minka's feeding note mentions ordinary food twice a day, while the vet's advice says "
       "renal diet food only.", "minka, cat food, renal diet", "pets",
       a_ref="fact:minka_feeding", b_ref="fact:minka_renal_diet"),
    _C("bin_day", "de", "Mülltonne", "Dienstag", "Mittwoch",
       "Die graue Tonne kommt laut deiner Notiz dienstags raus, laut dem neuen "
       "Abfallkalender aber mittwochs.", "mülltonne, abfuhr, abfallkalender",
       "routines/daily", a_ref="fact:bin_day"),
    _C("skat_location", "en", "Skat evening", "at Frau Becker's", "at the Ratskeller",
       "One memory says skat evening is at Frau Becker's house, another that the group moved "
       "to the Ratskeller after her knee trouble started.", "skat, becker, ratskeller",
       "people/friends", a_ref="fact:skat_evening", resolution="detected"),
    _C("ingrid_visit_dates", "de", "Besuch von Ingrid", "19.–22. Dezember", "ab 23. Dezember",
       "Ingrid hat am Telefon vom 19. Dezember gesprochen, auf ihrer Karte steht aber, dass "
       "sie erst am 23. kommt.", "ingrid, besuch, dezember", "people/family",
       a_ref="fact:ingrid_visit", person="ingrid"),
    _C("anna_birthday", "en", "Anna's birthday", "29 September", "27 September",
       "Anna's birthday is stored as 29 September, but an old calendar entry says "
       "27 September.", "anna, birthday, calendar", "people/family",
       a_ref="fact:birthday_anna", resolution="resolved", person="anna"),
    _C("thermostat_night", "de", "Nachttemperatur", "17 Grad", "19 Grad",
       "Die Nachtabsenkung im Wohnzimmer ist einmal mit 17 Grad, einmal mit 19 Grad notiert; "
       "Anna hatte es im Herbst wärmer gestellt.", "heizung, thermostat, nacht",
       "devices/heating", a_ref="fact:heating_night_setback"),
    _C("twinr_volume", "en", "Twinr volume", "7", "5",
       "Twinr's daytime volume is set to 7, but last week you said it was too loud and asked "
       "for 5.", "twinr, volume, loud", "devices/twinr", a_ref="fact:twinr_volume",
       resolution="pending_confirmation"),
    _C("hairdresser_time", "de", "Friseur", "14 Uhr", "15:30 Uhr",
       "Für den Friseurtermin am 21. November gibt es zwei Uhrzeiten: 14 Uhr aus dem Kalender "
       "und 15:30 Uhr aus der SMS vom Salon.", "friseur, uhrzeit, salon", "people/services",
       a_ref="fact:hairdresser"),
    _C("lawn_price", "en", "Lawn mowing price", "15 euros", "20 euros",
       "According to the old note Emre mows the lawn for 15 euros; Herr Yilmaz mentioned "
       "20 euros this year.", "lawn, emre, price", "garden", a_ref="fact:lawn_mowing",
       resolution="resolved"),
    _C("church_time", "de", "Gottesdienst", "10 Uhr", "9:30 Uhr",
       "Der Gottesdienst in St. Marien beginnt laut deiner Routine um 10 Uhr, laut "
       "Gemeindebrief im Winter schon um 9:30 Uhr.", "gottesdienst, uhrzeit, gemeindebrief",
       "routines/daily", a_ref="fact:church_sunday"),
    _C("mia_strawberries", "en", "Mia and strawberries", "no allergy", "strawberry rash",
       "Anna never mentioned an allergy for Mia, but after the summer party you noticed a rash "
       "from strawberries.", "mia, strawberries, rash", "people/family",
       resolution="detected", person="mia", galaxy="anna"),
    _C("cleaning_day", "de", "Putzhilfe", "Freitag", "Donnerstag",
       "Frau Kowalski kommt laut Absprache freitags, hat aber die letzten zwei Wochen "
       "donnerstags geklingelt.", "putzhilfe, kowalski, wochentag", "home/help",
       a_ref="fact:cleaning_help", person="kowalski"),
    _C("guest_wifi_name", "en", "Guest Wi-Fi name", "Gartenblick-Gast", "FRITZ!Box Gast",
       "The guest network is noted as 'Gartenblick-Gast', but Lukas says phones only show "
       "'FRITZ!Box Gast'.", "wifi, guests, network name", "devices/network",
       a_ref="fact:guest_wifi", resolution="resolved"),
    _C("apple_harvest", "de", "Apfelernte", "Anfang Oktober", "Ende September",
       "Der Boskoop ist laut Notiz Anfang Oktober reif, letztes Jahr hast du aber schon Ende "
       "September gepflückt.", "apfelbaum, ernte, boskoop", "garden",
       a_ref="fact:apple_tree"),
    _C("bruno_food_amount", "en", "Bruno's food", "300 g", "250 g",
       "Bruno's daily food is noted as 300 g, while the vet suggested cutting down to 250 g "
       "because of his weight.", "bruno, dog food, weight", "pets", a_ref="fact:bruno_food",
       person="anna", galaxy="anna"),
    _C("metformin_timing", "de", "Metformin", "Mittag- und Abendessen",
       "Frühstück und Abendessen",
       "Metformin steht einmal mit Mittag- und Abendessen im Plan, im Medikationsplan vom "
       "Oktober aber mit Frühstück und Abendessen.", "metformin, medikationsplan, mahlzeiten",
       "health/medication", a_ref="fact:med_metformin", resolution="pending_confirmation",
       vis="private"),
    _C("physio_day", "en", "Physiotherapy day", "Tuesday", "Wednesday",
       "Physiotherapy with Jonas is noted for Tuesdays at 11, but the reminder card from the "
       "practice says Wednesday.", "physiotherapy, jonas, weekday", "health/appointments",
       a_ref="fact:physio_series"),
    _C("peony_planter", "de", "Pfingstrosen", "Heinz", "Ingrid",
       "Du hast erzählt, Heinz habe die Pfingstrosen gepflanzt; Ingrid meint, sie habe sie "
       "euch 1998 geschenkt und selbst eingesetzt.", "pfingstrosen, heinz, ingrid", "garden",
       a_ref="fact:peonies"),
    _C("newspaper_pause", "en", "Newspaper pause", "paused", "still delivered",
       "The newspaper should be paused during your trip to Lübeck, but Herr Yilmaz says it is "
       "still piling up in the letterbox.", "newspaper, pause, letterbox", "household",
       a_ref="fact:newspaper"),
    _C("anna_late_shift", "de", "Spätdienst von Anna", "Dienstag und Donnerstag",
       "Montag und Mittwoch",
       "Annas Spätdienste sind für Dienstag und Donnerstag gespeichert, sie hat aber gesagt, "
       "dass sie ab November montags und mittwochs länger arbeitet.",
       "anna, spätdienst, apotheke", "people/family", a_ref="fact:anna_workplace",
       person="anna", galaxy="anna"),
    _C("vitamin_d_dose", "en", "Vitamin D", "20,000 IU weekly", "1,000 IU daily",
       "Vitamin D is stored as one 20,000 IU capsule on Sundays, but the new packet in the "
       "bathroom contains 1,000 IU tablets for every day.", "vitamin d, dose, weekly",
       "health/medication", a_ref="fact:med_vitamin_d", vis="private"),
    _C("grocery_day", "de", "Lebensmittellieferung", "Donnerstag", "Freitag",
       "Die Edeka-Lieferung kommt laut Plan donnerstags; die letzte Bestätigungs-Mail nennt "
       "aber Freitag zwischen 10 und 12 Uhr.", "lieferung, edeka, wochentag", "household",
       a_ref="fact:grocery_delivery"),
    _C("eye_doctor_ride", "en", "Ride to the eye doctor", "Anna drives", "taxi",
       "For the eye appointment Anna offered to drive you, but a Taxi Hansa ride is booked "
       "too – one of them should be cancelled.", "eye doctor, taxi, anna",
       "health/appointments", a_ref="fact:eye_doctor", b_ref="fact:taxi_number"),
    _C("thomas_coffee", "de", "Kaffee für Thomas", "mit viel Milch", "schwarz",
       "Thomas trinkt laut Anna Kaffee mit viel Milch, bei seinem letzten Besuch wollte er "
       "ihn aber schwarz.", "thomas, kaffee, milch", "people/family",
       a_ref="fact:pref_thomas_coffee", resolution="resolved", person="thomas",
       galaxy="anna"),
    _C("heinz_grave", "en", "Heinz's grave", "Riensberg cemetery", "Walle cemetery",
       "Heinz's grave is noted at Riensberg cemetery, but a page in the address book says "
       "Walle cemetery.", "heinz, cemetery, grave", "people/family",
       a_ref="fact:wedding_anniversary", resolution="resolved", vis="private"),
    _C("minka_age", "de", "Alter von Minka", "14 Jahre", "16 Jahre",
       "Minka ist laut Heimtierausweis 14 Jahre alt; du erzählst aber oft, sie sei schon 16.",
       "minka, alter, heimtierausweis", "pets"),
    _C("smoke_detector_check", "en", "Smoke detector check", "March 2027", "November 2026",
       "The next smoke detector check is stored as March 2027, but the landlord's letter says "
       "November 2026.", "smoke detector, check, landlord", "home/safety",
       a_ref="fact:smoke_detectors", resolution="detected"),
    _C("skat_rhythm", "de", "Skatabend-Rhythmus", "jeden zweiten Donnerstag",
       "jeden Donnerstag",
       "Frau Becker hat gesagt, der Skatabend sei jetzt jeden Donnerstag – bisher war „jeden "
       "zweiten Donnerstag“ gespeichert.", "skat, donnerstag, becker", "people/friends",
       a_ref="fact:skat_evening"),
    _C("lukas_glasses", "en", "Glasses for Lukas", "needs glasses", "no glasses",
       "Anna mentioned Lukas may need glasses to read the board at school; Thomas says the "
       "school eye test was fine.", "lukas, glasses, eye test", "people/family",
       resolution="detected", person="lukas", galaxy="anna"),
    _C("pantoprazole_stop", "de", "Pantoprazol", "weiter nehmen", "absetzen",
       "Pantoprazol steht noch im Tagesplan, aber nach der letzten Magenspiegelung war vom "
       "Absetzen die Rede.", "pantoprazol, absetzen, magen", "health/medication",
       a_ref="fact:med_pantoprazole", resolution="pending_confirmation", vis="private"),
    _C("bird_food", "en", "Bird feeding", "sunflower seeds", "fat balls",
       "You fill the bird feeder with sunflower seeds, but Mia brought fat balls and says the "
       "tits prefer them.", "birds, feeder, fat balls", "garden", a_ref="fact:bird_feeder",
       resolution="resolved"),
)  # fmt: skip


def _conflict_payload(
    item_id: str,
    summary: str,
    status: str,
    slot_key: str,
    candidates: Sequence[tuple[str, str, str]],
    resolution: str,
) -> dict[str, Any]:
    return {
        "memory_id": item_id,
        "kind": "conflict",
        "summary": summary,
        "status": status,
        "slot_key": slot_key,
        "candidates": [
            {"memory_id": ref, "value_key": value_key, "summary": text}
            for ref, value_key, text in candidates
        ],
        "resolution_status": resolution,
    }


def _conflicts(namespace: str, slots: Mapping[str, str]) -> list[Record]:
    records = [_thermos_conflict(namespace)]
    for index, thing in enumerate(t for t in _THINGS if t.alt):
        place, alt = _PLACES[thing.place], _PLACES[thing.alt]
        item_id = f"conflict:{thing.slug}_location"
        resolution = _location_resolution(thing)
        status = _RESOLUTION_STATUS[resolution]
        at_a, at_b = _place_at(place, thing.lang), _place_at(alt, thing.lang)
        template = _LOCATION_CLASH[thing.lang][index % 2]
        summary = template.format(
            Phrase=_cap(thing.phrase), phrase=thing.phrase, verb=thing.verb, at_a=at_a, at_b=at_b
        )
        label_a, label_b = _place_label(place, thing.lang), _place_label(alt, thing.lang)
        candidates = (
            (f"fact:{thing.slug}_location", thing.place, label_a),
            (f"claim:{thing.slug}_location_alt", thing.alt, label_b),
        )
        records.append(
            _record(
                namespace,
                "conflicts",
                item_id,
                schema=CONFLICT_SCHEMA,
                payload=_conflict_payload(
                    item_id, summary, status, f"location:{thing.slug}", candidates, resolution
                ),
                title=f"{thing.noun}: {label_a} vs. {label_b}",
                tags=[*_location_tags(thing, place), label_b.lower()],
                ring=f"home/{place.room}",
                lang=thing.lang,
                category="location",
                person="margarete",
                visibility=[thing.vis],
                updated_at=_when(item_id, _CONFLICT_START, _END),
                facets={"room": place.room, "resolution": resolution},
            )
        )
    for clash in _CLASHES:
        item_id = f"conflict:{clash.slug}"
        status = _RESOLUTION_STATUS[clash.resolution]
        a_ref = clash.a_ref or f"claim:{clash.slug}_a"
        b_ref = clash.b_ref or f"claim:{clash.slug}_b"
        candidates = ((a_ref, _key(clash.a), clash.a), (b_ref, _key(clash.b), clash.b))
        slot_key = slots.get(a_ref, f"topic:{clash.slug}")
        records.append(
            _record(
                namespace,
                "conflicts",
                item_id,
                schema=CONFLICT_SCHEMA,
                payload=_conflict_payload(
                    item_id, clash.body, status, slot_key, candidates, clash.resolution
                ),
                title=f"{clash.subject}: {clash.a} vs. {clash.b}",
                tags=_tags(clash.tags),
                ring=clash.ring,
                lang=clash.lang,
                category=clash.ring.split("/")[0],
                person=clash.person,
                visibility=clash.vis.split(),
                updated_at=_when(item_id, _CONFLICT_START, _END),
                galaxy=clash.galaxy,
                facets={"resolution": clash.resolution},
            )
        )
    return records


def _thermos_conflict(namespace: str) -> Record:
    item_id = "conflict:thermos_location"
    summary = (
        "Zwei Angaben zur roten Thermoskanne widersprechen sich: eine ältere Erinnerung sagt "
        "Flurschrank, eine neuere Küchenregal. Noch nicht bestätigt."
    )
    candidates = (
        ("fact:thermos_location_old", "flurschrank", "Flurschrank"),
        ("fact:thermos_location_current", "kuechenregal", "Küchenregal"),
    )
    return _record(
        namespace,
        "conflicts",
        item_id,
        schema=CONFLICT_SCHEMA,
        payload=_conflict_payload(
            item_id, summary, "active", "location:thermos", candidates, "open"
        ),
        title="Thermoskanne: Flurschrank vs. Küchenregal",
        tags=["thermoskanne", "flurschrank", "küchenregal"],
        ring="home/kitchen",
        lang="de",
        category="location",
        person="margarete",
        visibility=["family"],
        updated_at=_when(item_id, _CONFLICT_START, _END),
        facets={"room": "kitchen", "resolution": "open"},
    )


# --------------------------------------------------------------------------- archive


class _Old(NamedTuple):
    slug: str
    lang: str
    title: str
    body: str
    tags: str
    ring: str
    superseded_by: str = ""
    person: str = "margarete"
    galaxy: str = "default"
    vis: str = "family"


_O = _Old
_OLD: tuple[_Old, ...] = (
    _O("gp_dr_hoffmann", "de", "Hausarzt Dr. Hoffmann",
       "Dein Hausarzt war Dr. Hoffmann in der Georgstraße, bis er im Frühjahr 2025 in den "
       "Ruhestand ging.", "hausarzt, hoffmann, ruhestand", "health/contacts",
       "fact:contact_gp", vis="private"),
    _O("ramipril_evening", "en", "Ramipril in the evening",
       "Until spring 2025 you took ramipril 2.5 mg in the evening.",
       "ramipril, dose, evening", "health/medication", "fact:med_ramipril", vis="private"),
    _O("anna_old_mobile", "de", "Alte Handynummer von Anna",
       "Annas alte Handynummer endete auf 4471; seit dem Vertragswechsel gilt eine neue.",
       "anna, handynummer, vertrag", "people/family", person="anna", galaxy="anna"),
    _O("old_car", "en", "The old Golf",
       "The silver VW Golf was sold to a neighbour's nephew in June 2025; since then Anna "
       "drives you when needed.", "car, golf, sold", "home/garage"),
    _O("lukas_primary_school", "de", "Grundschule von Lukas",
       "Lukas ging bis zum Sommer 2025 auf die Grundschule am Lehmweg; jetzt ist er auf dem "
       "Gymnasium.", "lukas, grundschule, gymnasium", "people/family", person="lukas",
       galaxy="anna"),
    _O("old_physio", "en", "Former physiotherapist",
       "Physiotherapy used to be with Frau Kranz at Reha am Deich until she moved away.",
       "physiotherapy, kranz, former", "health/appointments", "fact:physio_series"),
    _O("cleaning_wednesday", "de", "Putzhilfe mittwochs",
       "Frau Kowalski kam mittwochs nachmittags; seit dem Herbst 2025 kommt sie freitags.",
       "putzhilfe, mittwoch, kowalski", "home/help", "fact:cleaning_help",
       person="kowalski"),
    _O("sunday_paper", "en", "Sunday paper",
       "You used to get the Bild am Sonntag as well; that subscription was cancelled in 2025.",
       "newspaper, subscription, cancelled", "household"),
    _O("old_wifi_name", "de", "Altes WLAN",
       "Das WLAN hieß „Haus-am-Teich“, bis Lukas den neuen Router eingerichtet hat.",
       "wlan, router, lukas", "devices/network", "fact:guest_wifi"),
    _O("minka_pouches", "en", "Minka's old food",
       "Before the kidney diagnosis, Minka got salmon pouches and a few treats every evening.",
       "minka, pouches, treats", "pets", "fact:minka_renal_diet"),
    _O("skat_clubhouse", "de", "Skat im Vereinsheim",
       "Der Skatabend fand bis Anfang 2025 im Vereinsheim des Kleingartenvereins statt.",
       "skat, vereinsheim, kleingarten", "people/friends"),
    _O("heating_all_day", "en", "Old heating schedule",
       "The heating ran at 22 °C all day with no night setback, until Anna changed it to save "
       "gas.", "heating, schedule, gas", "devices/heating", "fact:heating_night_setback"),
    _O("timolol_drops", "de", "Alte Augentropfen",
       "Die Augentropfen mit Timolol wurden wegen Atembeschwerden abgesetzt.",
       "augentropfen, timolol, abgesetzt", "health/medication", "fact:med_eye_drops",
       vis="private"),
    _O("salon_petra", "en", "Former hairdresser",
       "You went to Salon Petra on Hauptstraße until it closed in January 2025.",
       "hairdresser, salon petra, closed", "people/services", "fact:hairdresser"),
    _O("bank_advisor_lueders", "de", "Bankberaterin Frau Lüders",
       "Deine Ansprechpartnerin bei der Sparkasse war Frau Lüders, bis sie in eine andere "
       "Filiale gewechselt ist.", "sparkasse, beraterin, lüders", "household/finance",
       "fact:bank_branch", vis="private"),
    _O("mia_kindergarten", "en", "Mia's kindergarten",
       "Mia was picked up from the Sonnenblume kindergarten at 3 pm on Fridays, before she "
       "started school in 2025.", "mia, kindergarten, pickup", "people/family", person="mia",
       galaxy="anna"),
    _O("bin_monday", "de", "Müllabfuhr montags",
       "Bis Ende 2024 wurde die graue Tonne montags geleert.", "mülltonne, montag, abfuhr",
       "routines/daily", "fact:bin_day"),
    _O("twinr_voice_hans", "en", "Twinr's first voice",
       "Twinr originally spoke with the male voice 'Hans'; you switched to a calmer female "
       "voice in 2025.", "twinr, voice, settings", "devices/twinr"),
    _O("midnight_bedtime", "de", "Schlafenszeit nach dem Spätfilm",
       "Du bist lange erst nach dem Spätfilm gegen Mitternacht ins Bett gegangen.",
       "schlafenszeit, spätfilm, mitternacht", "routines/daily", "fact:bedtime"),
    _O("holiday_2025", "en", "Holiday at the Baltic",
       "Summer holiday 2025: one week in Timmendorfer Strand with Ingrid, at the Hotel "
       "Seeblick.", "holiday, baltic sea, ingrid", "people/family", person="ingrid"),
    _O("blood_sugar_meter", "de", "Altes Blutzuckermessgerät",
       "Das Blutzuckermessgerät mit Teststreifen wurde durch einen Sensor am Oberarm "
       "ersetzt.", "blutzucker, messgerät, sensor", "health/devices", vis="private"),
    _O("anna_altona_flat", "en", "Anna's old flat",
       "Anna and Thomas lived in Altona, on Bahrenfelder Straße, before moving to Eppendorf.",
       "anna, altona, flat", "people/family", "fact:anna_address", person="anna",
       galaxy="anna"),
    _O("koehler_lawn", "de", "Rasenmähen durch Herrn Köhler",
       "Herr Köhler hat den Rasen gemäht, bis er 2025 aus Altersgründen aufgehört hat.",
       "rasen, köhler, garten", "garden", "fact:lawn_mowing"),
    _O("dentist_brinkmann", "en", "Former dentist",
       "Your dentist was Dr. Brinkmann until Dr. Sommer took over the practice.",
       "dentist, brinkmann, practice", "health/contacts", "fact:dentist_checkup"),
    _O("ndr_button_seven", "de", "Alte Senderliste",
       "Vor dem Sendersuchlauf lag der NDR auf Taste 7 der Fernbedienung.",
       "fernseher, sender, suchlauf", "devices/media", "fact:tv_favourites"),
    _O("river_walk", "en", "Old walking route",
       "Your morning walk went along the river, until the path was closed for construction.",
       "walk, river, construction", "routines/daily", "fact:morning_walk"),
    _O("bruno_puppy_school", "de", "Welpenschule",
       "Bruno war bis zum Frühjahr 2025 samstags in der Welpenschule am Stadtpark.",
       "bruno, welpenschule, samstag", "pets", person="anna", galaxy="anna"),
    _O("knee_brace", "en", "Knee brace",
       "After the fall in February 2025 you wore a knee brace for six weeks.",
       "knee, brace, fall", "health/history", vis="private"),
    _O("crumble_apple_cake", "de", "Apfelkuchen mit Streuseln",
       "Den Apfelkuchen hast du mit Margarine und Streuseln gebacken, bevor du auf das "
       "versunkene Rezept umgestiegen bist.", "apfelkuchen, streusel, margarine", "recipes",
       "fact:recipe_apple_cake"),
    _O("ingrid_emergency_contact", "en", "Emergency contact",
       "Ingrid was the first emergency contact; it is now Anna because she lives closer.",
       "emergency contact, ingrid, anna", "health/safety", person="ingrid", vis="private"),
    _O("vet_vogt", "de", "Frühere Tierärztin",
       "Minka war bei Dr. Vogt in der Kurfürstenallee, bis die Praxis geschlossen hat.",
       "tierärztin, vogt, minka", "pets", "fact:minka_vet"),
    _O("christmas_2025", "en", "Christmas 2025",
       "Christmas 2025 was celebrated at Anna's in Hamburg; you stayed three nights and took "
       "the train back on the 27th.", "christmas, hamburg, train", "people/family",
       person="anna"),
    _O("metformin_once", "de", "Metformin einmal täglich",
       "Metformin hast du nur einmal täglich zum Abendessen genommen.",
       "metformin, abendessen, dosis", "health/medication", "fact:med_metformin",
       vis="private"),
)  # fmt: skip


def _successors() -> frozenset[str]:
    """Facts that replaced an archived one (stamped after the archive window)."""
    located = {f"fact:{t.slug}_location" for t in _THINGS if t.old}
    return frozenset(located | {old.superseded_by for old in _OLD if old.superseded_by})


def _archive(namespace: str) -> list[Record]:
    records = []
    for thing in (t for t in _THINGS if t.old):
        old = _PLACES[thing.old]
        item_id = f"archive:{thing.slug}_location_old"
        updated_at = _when(item_id, _START, _ARCHIVE_END)
        summary = _LOCATED_BEFORE[thing.lang].format(
            month=_month(updated_at, thing.lang),
            verb=_PAST[thing.verb],
            phrase=thing.phrase,
            at=_place_at(old, thing.lang),
        )
        payload = _object_payload(
            item_id, "fact", summary, "superseded", f"location:{thing.slug}", thing.old
        )
        payload["superseded_by"] = f"fact:{thing.slug}_location"
        suffix = "früher" if thing.lang == "de" else "before"
        records.append(
            _record(
                namespace,
                "archive",
                item_id,
                schema=OBJECT_SCHEMA,
                payload=payload,
                title=f"{thing.noun} – {_place_label(old, thing.lang)} ({suffix})",
                tags=_location_tags(thing, old),
                ring=f"home/{old.room}",
                lang=thing.lang,
                category="location",
                person="margarete",
                visibility=[thing.vis],
                updated_at=updated_at,
                facets={"room": old.room},
            )
        )
    for old_fact in _OLD:
        item_id = f"archive:{old_fact.slug}"
        status = "superseded" if old_fact.superseded_by else "archived"
        payload = _object_payload(
            item_id,
            "fact",
            old_fact.body,
            status,
            f"{old_fact.ring.split('/')[0]}:{old_fact.slug}",
            _key(old_fact.title),
        )
        if old_fact.superseded_by:
            payload["superseded_by"] = old_fact.superseded_by
        records.append(
            _record(
                namespace,
                "archive",
                item_id,
                schema=OBJECT_SCHEMA,
                payload=payload,
                title=old_fact.title,
                tags=_tags(old_fact.tags),
                ring=old_fact.ring,
                lang=old_fact.lang,
                category=old_fact.ring.split("/")[0],
                person=old_fact.person,
                visibility=old_fact.vis.split(),
                updated_at=_when(item_id, _START, _ARCHIVE_END),
                galaxy=old_fact.galaxy,
            )
        )
    return records


# ------------------------------------------------------------------- midterm episodes


class _Episode(NamedTuple):
    slug: str
    lang: str
    day: int  # day of October 2026 it happened
    title: str
    body: str
    tags: str
    person: str = "margarete"
    galaxy: str = "default"
    vis: str = "family"


_E = _Episode
_EPISODES: tuple[_Episode, ...] = (
    _E("anna_call_birthday_party", "en", 29, "Anna called about the party",
       "Yesterday Anna called about Thomas's 50th birthday party: it moves to Saturday "
       "14 November, and she asked you to bake your marble cake.",
       "anna, phone call, birthday party", person="anna"),
    _E("yilmaz_parcel", "de", 27, "Paket bei Herrn Yilmaz",
       "Gestern hat Herr Yilmaz ein Paket für dich angenommen – vermutlich die neuen "
       "Hausschuhe; du kannst es heute Abend abholen.", "paket, yilmaz, hausschuhe",
       person="yilmaz"),
    _E("lab_results", "en", 21, "Lab results",
       "Dr. Weber's practice rang this morning: the blood values are fine, only the long-term "
       "sugar is slightly up.", "dr. weber, lab results, blood sugar", vis="private"),
    _E("lukas_video_calls", "de", 14, "Lukas zu Besuch",
       "Lukas war am Mittwoch da und hat dir gezeigt, wie du auf dem Tablet Videoanrufe "
       "startest.", "lukas, tablet, videoanruf", person="lukas"),
    _E("ingrid_hip", "en", 18, "Ingrid's hip",
       "Ingrid called on Sunday evening: her hip operation in Lübeck went well and she will "
       "be home again next week.", "ingrid, hip, operation", person="ingrid"),
    _E("minka_sick", "de", 25, "Minka hat gespuckt",
       "Minka hat vorgestern zweimal gespuckt, frisst aber wieder normal – beobachten und "
       "bei Wiederholung zur Tierärztin.", "minka, gespuckt, beobachten"),
    _E("power_cut", "en", 6, "Power cut",
       "There was a short power cut on Tuesday night; the freezer stayed cold, but the "
       "kitchen clock needs resetting.", "power cut, freezer, clock"),
    _E("becker_new_knee", "de", 8, "Neues Knie für Frau Becker",
       "Beim Skat hat Frau Becker erzählt, dass sie im Dezember ein neues Knie bekommt und "
       "der Skatabend dann pausiert.", "becker, knie, skat", person="becker"),
    _E("mia_drawing", "en", 11, "Mia's drawing",
       "Mia sent a drawing of Minka in the post; you put it on the fridge and want to thank "
       "her on Sunday.", "mia, drawing, minka", person="mia"),
    _E("slipped_on_leaves", "de", 30, "Ausgerutscht im Garten",
       "Du bist gestern im Garten auf nassem Laub ausgerutscht, hast dir aber nichts getan; "
       "Anna möchte, dass das Laub weggefegt wird.", "garten, laub, ausgerutscht",
       vis="private"),
    _E("apples_for_juice", "en", 3, "Apples for juice",
       "Anna picked up two crates of Boskoop apples on Saturday to take to the juice press.",
       "anna, apples, juice", person="anna", galaxy="anna"),
    _E("church_bazaar", "de", 25, "Adventsbasar in St. Marien",
       "Nach dem Gottesdienst wurde der Adventsbasar angekündigt; du hast versprochen, zwei "
       "Bleche Butterkuchen zu backen.", "basar, butterkuchen, st. marien"),
    _E("thomas_london_trip", "en", 19, "Thomas in London",
       "Thomas is away with his class in London until Friday, so Anna is doing the school "
       "runs alone this week.", "thomas, london, class trip", person="thomas",
       galaxy="anna"),
    _E("gurgling_radiator", "de", 22, "Heizung gluckert",
       "Die Heizung im Bad hat die ganze Nacht gegluckert; Herr Yilmaz meint, sie müsse "
       "entlüftet werden.", "heizung, entlüften, bad"),
    _E("missed_eye_drops", "en", 29, "Missed eye drops",
       "On Thursday evening you forgot the eye drops and only remembered at midnight; Twinr "
       "should remind you again at 9.30 if needed.", "eye drops, missed, reminder",
       vis="private"),
)  # fmt: skip


def _episodes(namespace: str) -> list[Record]:
    records = []
    for episode in _EPISODES:
        item_id = f"episode:{episode.slug}"
        occurred = datetime(2026, 10, episode.day, tzinfo=UTC)
        # Written down the next day, at a stable minute between 08:00 and 20:00.
        updated_at = _when(
            item_id, occurred + timedelta(days=1, hours=8), occurred + timedelta(days=1, hours=20)
        )
        payload = {
            "memory_id": item_id,
            "kind": "episode",
            "summary": episode.body,
            "status": "active",
            "occurred_on": occurred.date().isoformat(),
            "participants": sorted({"margarete", episode.person}),
        }
        records.append(
            _record(
                namespace,
                "midterm",
                item_id,
                schema=EPISODE_SCHEMA,
                payload=payload,
                title=episode.title,
                tags=_tags(episode.tags),
                ring="episodes/recent",
                lang=episode.lang,
                category="episode",
                person=episode.person,
                visibility=episode.vis.split(),
                updated_at=updated_at,
                galaxy=episode.galaxy,
            )
        )
    return records


# ------------------------------------------------------------------------------ graph


class _Edge(NamedTuple):
    slug: str
    lang: str
    subject: str
    predicate: str
    object: str
    body: str
    person: str
    ring: str = "people/family"
    status: str = "active"
    galaxy: str = "default"


_G = _Edge
_EDGES: tuple[_Edge, ...] = (
    _G("anna_daughter_of_margarete", "en", "Anna", "daughter of", "Margarete",
       "Anna is Margarete's only daughter; she lives in Hamburg with Thomas and their two "
       "children.", "anna"),
    _G("thomas_married_to_anna", "de", "Thomas", "verheiratet mit", "Anna",
       "Thomas ist seit 2011 mit Anna verheiratet; er kommt aus Leeds und spricht mit den "
       "Kindern Englisch.", "thomas", galaxy="anna"),
    _G("lukas_son_of_anna", "en", "Lukas", "son of", "Anna",
       "Lukas (12) is Anna and Thomas's son and Margarete's grandson.", "lukas"),
    _G("mia_daughter_of_anna", "de", "Mia", "Tochter von", "Anna",
       "Mia (8) ist Annas Tochter und die kleine Schwester von Lukas.", "mia"),
    _G("ingrid_sister_of_margarete", "en", "Ingrid", "sister of", "Margarete",
       "Ingrid is Margarete's younger sister and lives on her own in Lübeck.", "ingrid"),
    _G("heinz_husband_of_margarete", "de", "Heinz", "Ehemann von", "Margarete",
       "Heinz war Margaretes Ehemann; er ist 2019 gestorben und liegt in Riensberg begraben.",
       "heinz"),
    _G("yilmaz_neighbour", "de", "Herr Yilmaz", "Nachbar von", "Margarete",
       "Herr Yilmaz ist Margaretes Nachbar von nebenan; er hat einen Notfallschlüssel und "
       "hilft bei Glatteis mit dem Auto.", "yilmaz", ring="people/neighbours"),
    _G("emre_son_of_yilmaz", "en", "Emre", "son of", "Herr Yilmaz",
       "Emre is the son of the family next door; he mows the lawn and carries heavy "
       "shopping.", "emre", ring="people/neighbours"),
    _G("becker_friend", "en", "Hilde Becker", "friend of", "Margarete",
       "Hilde Becker has been Margarete's friend since their school days; they play skat "
       "together.", "becker", ring="people/friends"),
    _G("weber_gp", "de", "Dr. Weber", "Hausärztin von", "Margarete",
       "Dr. Weber ist Margaretes Hausärztin in der Praxis am Wall.", "weber",
       ring="health/contacts"),
    _G("jonas_physio", "en", "Jonas", "physiotherapist of", "Margarete",
       "Jonas treats Margarete's right knee at the physiotherapy practice on Tuesdays.",
       "jonas", ring="health/contacts"),
    _G("minka_cat_of", "de", "Minka", "Katze von", "Margarete",
       "Minka ist Margaretes getigerte Katze, 14 Jahre alt, und lebt nur in der Wohnung.",
       "margarete", ring="pets"),
    _G("bruno_dog_of", "en", "Bruno", "dog of", "Anna",
       "Bruno is Anna's family dog, a four-year-old Labrador mix.", "anna", galaxy="anna",
       ring="pets"),
    _G("kowalski_helper", "de", "Frau Kowalski", "Haushaltshilfe von", "Margarete",
       "Frau Kowalski hilft Margarete seit 2023 einmal pro Woche im Haushalt.", "kowalski",
       ring="home/help"),
    _G("sommer_dentist", "en", "Dr. Sommer", "dentist of", "Margarete",
       "Dr. Sommer took over Margarete's dental practice and does her check-ups twice a "
       "year.", "sommer", status="candidate", ring="health/contacts"),
)  # fmt: skip


def _relations(namespace: str) -> list[Record]:
    records = []
    for edge in _EDGES:
        item_id = f"rel:{edge.slug}"
        payload = {
            "memory_id": item_id,
            "kind": "relation",
            "summary": edge.body,
            "status": edge.status,
            "subject": edge.subject,
            "predicate": edge.predicate,
            "object": edge.object,
        }
        records.append(
            _record(
                namespace,
                "graph",
                item_id,
                schema=RELATION_SCHEMA,
                payload=payload,
                title=f"{edge.subject} — {edge.predicate} — {edge.object}",
                tags=[edge.subject.lower(), edge.predicate.lower(), edge.object.lower()],
                ring=edge.ring,
                lang=edge.lang,
                category="relation",
                person=edge.person,
                visibility=["family"],
                updated_at=_when(item_id, _START, _END),
                galaxy=edge.galaxy,
            )
        )
    return records


# ------------------------------------------------------------------------- public api


def sample_records(namespace: str = SAMPLE_NAMESPACE) -> list[Record]:
    """The sample household memory of `namespace`: ~300 records over five snapshot kinds.

    Deterministic: two calls with the same namespace return equal records in the same
    order. Every item id appears once; no record carries a vector.
    """
    successors = _successors()
    objects = [
        *_location_facts(namespace, successors),
        *_preference_facts(namespace),
        *_note_facts(namespace, successors),
    ]
    slots = {record.item_id: str(record.payload["slot_key"]) for record in objects}
    return [
        *objects,
        *_conflicts(namespace, slots),
        *_archive(namespace),
        *_episodes(namespace),
        *_relations(namespace),
    ]


_QUERIES: tuple[tuple[str, str, str], ...] = (
    ("longterm:objects:current", "Wo stand früher meine rote Thermoskanne?",
     "fact:thermos_location_old"),
    ("longterm:objects:current", "Where are my reading glasses?",
     "fact:reading_glasses_location"),
    ("longterm:objects:current", "Wann nehme ich meine Blutdrucktabletten?",
     "fact:med_ramipril"),
    ("longterm:objects:current", "What temperature is the heating set to at night?",
     "fact:heating_night_setback"),
    ("longterm:objects:current", "Wie geht das Rezept für den Apfelkuchen?",
     "fact:recipe_apple_cake"),
    ("longterm:objects:current", "When is Bruno's vaccination at the vet?",
     "fact:bruno_vet"),
    ("longterm:conflicts:current", "Steht die Thermoskanne im Flurschrank oder im Küchenregal?",
     "conflict:thermos_location"),
    ("longterm:conflicts:current", "Which days is Lukas's football training?",
     "conflict:lukas_football_day"),
    ("longterm:archive:current", "Wer war früher mein Hausarzt?",
     "archive:gp_dr_hoffmann"),
    ("midterm:current", "What did Anna say on the phone about the birthday party?",
     "episode:anna_call_birthday_party"),
    ("graph:current", "Wer ist unser Nachbar Herr Yilmaz?", "rel:yilmaz_neighbour"),
)  # fmt: skip


def sample_queries() -> list[dict[str, str]]:
    """Example queries over `sample_records()`: scope ref, query text, expected best item."""
    return [
        {"scope_ref": scope_ref, "query_text": query_text, "expect_item_id": expect_item_id}
        for scope_ref, query_text, expect_item_id in _QUERIES
    ]
