"""The parity tests: proof that auto/, explicit/, typed/ and a one-device run agree (helpers.py
holds what they share). The user tools live in tools/; compare.py, launch.py, bisect.py,
margins.py and collectives.py here are their old names, kept as aliases."""
