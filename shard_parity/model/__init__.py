"""The models and their operations, in Flax NNX: mlp.py, transformer.py, attention.py, ops.py.

They know nothing of meshes; the one exception is the `sum_partials` argument through which
explicit/'s tensor parallelism passes its psum into the call (mlp.py says how).
"""
