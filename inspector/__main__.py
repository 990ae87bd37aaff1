"""python -m inspector: the same command as python -m parity_tests.collectives."""

from .cli import run

if __name__ == '__main__':
    run()
