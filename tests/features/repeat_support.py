"""Helpers shared by test_repeat.py and the files split from it."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

BERLIN = ZoneInfo("Europe/Berlin")


def _pending(q: Any) -> list[str]:
    return list(q.browse("pending", n=1000))
