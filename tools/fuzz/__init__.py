"""python -m tools.fuzz: see cli.py."""
