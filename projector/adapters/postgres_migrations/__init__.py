"""Versioned SQL migrations of the projector's PostgreSQL tables (component `projector`
in the shared ledger, see `contracts.migrations`)."""

from __future__ import annotations

from importlib import resources

from contracts.migrations import Migration, migrations_from

__all__ = ["COMPONENT", "migrations"]

COMPONENT = "projector"


def migrations() -> list[Migration]:
    """This package's migration files, in version order."""
    return migrations_from(resources.files(__name__).iterdir(), where=__name__)
