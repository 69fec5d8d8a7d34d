"""The quality bench's metrics and BEIR loading (the bench itself is not a test)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.quality import _verdict, load_dataset, ndcg_at, recall_at

TINY_BEIR = Path(__file__).resolve().parents[1] / "data" / "beir-tiny"


def test_ndcg_perfect_worst_and_graded() -> None:
    relevant = {"a": 2, "b": 1}
    assert ndcg_at(["a", "b", "x"], relevant) == pytest.approx(1.0)
    assert ndcg_at(["x", "y"], relevant) == 0.0
    swapped = (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert ndcg_at(["b", "a"], relevant) == pytest.approx(swapped)
    assert ndcg_at([f"x{i}" for i in range(10)] + ["a"], relevant, k=10) == 0.0
    assert ndcg_at(["a"], {"a": 0}) == 0.0  # nothing relevant: defined as 0


def test_recall_counts_positive_judgments_only() -> None:
    relevant = {"a": 1, "b": 1, "c": 0}
    assert recall_at(["a", "c"], relevant) == 0.5
    assert recall_at(["b", "a"], relevant, k=1) == 0.5
    assert recall_at([], {}) == 0.0


def test_load_beir_directory() -> None:
    dataset = load_dataset(TINY_BEIR)
    assert dataset.name == "beir-tiny" and len(dataset.corpus) == 10
    assert dataset.qrels == {"q1": {"d4": 1}, "q2": {"d1": 1}, "q3": {"d2": 2}}
    assert dataset.queries["q2"] == "lighthouse keepers lamp wicks"


def _run(name: str, profile: str, sources: list[str], ndcg: float) -> dict[str, object]:
    return {"name": name, "profile": profile, "sources": sources, "ndcg@10": ndcg}


def test_verdict_compares_each_hybrid_with_its_own_sources() -> None:
    runs = [
        _run("lexical", "weighted@1+w:1", ["bm25"], 0.62),
        _run("lexical-text", "weighted@3+w:1", ["bm25"], 0.69),
        _run("vector", "weighted@1+w:2", ["vector"], 0.65),
        _run("rrf@1", "rrf@1", ["bm25", "vector"], 0.685),  # title x2 fields, as lexical
        _run("rrf@2", "rrf@2", ["bm25", "vector"], 0.68),  # the text field: below its own
        _run("weighted@2", "weighted@2", ["bm25", "vector"], 0.70),  # no own run: best
        _run("default", "weighted@3", ["bm25", "vector"], 0.74),
    ]
    verdict = _verdict(runs, 0.73)
    assert verdict["default_meets_target"] is True
    assert verdict["hybrids_above_both_sources"] == {
        "rrf@1": True,
        "rrf@2": False,
        "weighted@2": True,
        "default": True,
    }
    assert verdict["hybrids_above_every_single_source"] == {
        "rrf@1": False,
        "rrf@2": False,
        "weighted@2": True,
        "default": True,
    }
    assert _verdict(runs, 0.75)["default_meets_target"] is False
