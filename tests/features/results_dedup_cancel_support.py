"""Helpers shared by test_results_dedup_cancel.py and the files split from it."""

from __future__ import annotations


def _p(queue: str) -> str:
    return f"emq:{{{queue}}}:"
