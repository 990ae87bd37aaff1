"""python -m tools.compare: see cli.py."""
