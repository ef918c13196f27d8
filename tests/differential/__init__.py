"""The differential tier's program catalogue (see ``tests/test_differential.py``)."""
