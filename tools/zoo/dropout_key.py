"""dropout.py with the mask's key folded with the local row, not the global one: every device
draws the masks of device 0's rows (the bug zoo)."""

import jax

from . import dropout, planted

planted(globals(), dropout)


def rows(b):
    return jax.numpy.arange(b)  # BUG: the local rows; dropout.py adds axis_index(DATA) * b
