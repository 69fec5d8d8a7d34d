from __future__ import annotations

import json
from pathlib import Path

from contracts.export_schemas import MODELS

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def test_exported_schemas_are_current() -> None:
    """docs/schemas must match the models; run `make schemas` after changing contracts."""
    for name, model in MODELS.items():
        on_disk = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
        assert on_disk == model.model_json_schema(), f"{name}: run `make schemas`"
