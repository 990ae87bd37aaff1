"""Reads the collectives out of a compiled XLA program: the inspector's parser (inspector/hlo.py),
under the name the tests have always imported."""

from shard_parity.inspector.hlo import KINDS, Collective, collectives, compiled_text  # noqa: F401
