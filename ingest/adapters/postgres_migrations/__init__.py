"""Versioned SQL migrations of the canonical store (applied by postgres_db.migrate)."""
