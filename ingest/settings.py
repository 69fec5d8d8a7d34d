"""Settings of the write path (`ORRERY_INGEST_*`, read once, in `main()`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ingest.model import FlowLimits

__all__ = ["IngestSettings"]


class IngestSettings(BaseSettings):
    """`ORRERY_INGEST_*` environment variables: how the write routes pace each
    namespace's writers against the projector (`ingest.model.FlowLimits`; embedded, and
    server mode on PostgreSQL)."""

    model_config = SettingsConfigDict(env_prefix="ORRERY_INGEST_", extra="ignore")

    max_lag_events: int = Field(
        default=4_096,
        ge=0,
        description="A batch is written only while the projector is at most this many "
        "of its namespace's events behind; else the write waits (0: never)",
    )
    backlog_wait_seconds: float = Field(
        default=30.0,
        ge=0.0,
        le=3_600.0,
        description="How long a POST waits for the backlog to shrink before it answers "
        "503 ingest_backlog (Retry-After), nothing written",
    )
    searchable_wait_seconds: float = Field(
        default=30.0,
        ge=0.0,
        le=3_600.0,
        description="How long a POST with ?wait=searchable waits for its records to be "
        "searchable before it answers with searchable=false",
    )

    workers: int = Field(
        default=1,
        ge=0,
        le=16,
        description="Embedded: processes that parse, validate and write the batches of "
        "POST /v1/records beside the serving interpreter (1, the default: quiet 100k "
        "ingest 2,205 rec/s against 1,711 in process, at the same CPU a record; 0: in the "
        "serving process)",
    )

    def limits(self) -> FlowLimits:
        return FlowLimits(
            max_lag_events=self.max_lag_events,
            backlog_wait_seconds=self.backlog_wait_seconds,
            searchable_wait_seconds=self.searchable_wait_seconds,
        )
