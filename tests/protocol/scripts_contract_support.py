"""Helpers shared by test_scripts_contract.py and the files split from it."""

from __future__ import annotations

LANE = "PRT0KHTOWnGLuC"
