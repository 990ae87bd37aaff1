"""python -m tools.bisect: see cli.py."""
