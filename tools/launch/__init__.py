"""python -m tools.launch: see cli.py."""
