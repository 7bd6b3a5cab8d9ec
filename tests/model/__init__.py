"""The pure reference model of echomq's verb set (tests/model/test_model.py drives it)."""
