"""The session-31 measuring tools run, and measure what they name: an evidence check of
a built data dir passes and reads every document; the registry commit keeps the count."""

from __future__ import annotations

from pathlib import Path

from bench import evidence_check, registry_commit


def test_evidence_check_builds_a_data_dir_and_checks_every_generation(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    built = evidence_check.build(data_dir, 300)
    assert built["records"] == 300
    report = evidence_check.check(data_dir, repeat=2, profile=True)
    checks = report["checks"]
    assert [c["attempt"] for c in checks] == [0, 1]
    assert all(c["ok"] and c["documents"] == 300 for c in checks), checks
    assert all(c["cpu_s"] > 0 and c["wall_s"] > 0 for c in checks)
    # The last check only is profiled.
    assert "profile_top_tottime" not in checks[0]
    assert any("function calls" in line for line in checks[1]["profile_top_tottime"])


def test_registry_commit_reports_every_tenth_and_the_count() -> None:
    report = registry_commit.run(10_000, 1_000)
    assert report["document_count"] == 10_000
    assert [row["documents_held"] for row in report["tenths"]] == list(range(1_000, 10_001, 1_000))
    assert all(row["cpu_us_per_record"] > 0 for row in report["tenths"])
