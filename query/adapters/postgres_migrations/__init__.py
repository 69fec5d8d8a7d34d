"""Versioned SQL migrations of the query workers' PostgreSQL tables (component `query`
in the shared ledger, see `contracts.migrations`): the KoutenDB envelope's search
profiles and kept envelopes."""

from __future__ import annotations

from importlib import resources

from contracts.migrations import Migration, migrations_from

__all__ = ["COMPONENT", "migrations"]

COMPONENT = "query"


def migrations() -> list[Migration]:
    """This package's migration files, in version order."""
    return migrations_from(resources.files(__name__).iterdir(), where=__name__)
