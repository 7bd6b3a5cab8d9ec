"""The pure reference model of echomq's verb set (tests/test_model.py drives it)."""
