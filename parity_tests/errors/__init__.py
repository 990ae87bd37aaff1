"""The table of docs/errors.md in four parts (parity_tests/errors_table.py joins them)."""
