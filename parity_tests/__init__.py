"""Parity tests and tools: proof that auto/, explicit/ and a one-device run agree."""
