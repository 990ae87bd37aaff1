"""`python -m inspector` (installed: `python -m shard_parity.inspector`): see cli.py."""

from .cli import run

if __name__ == '__main__':
    run()
