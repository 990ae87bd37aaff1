"""explicit/composed.py with the gradients averaged over 'data' alone: not over 'seq', whose
devices hold other positions of the rows, nor over the experts' rows (the bug zoo)."""

from shard_parity.explicit import composed
from shard_parity.mesh import DATA

from . import planted

planted(globals(), composed)


def averaged_over(plan, spec) -> tuple[str, ...]:
    """The batch axes a gradient (and its param, cast before `grad`) is averaged over here:
    not those it is split over, nor 'fsdp', whose gather and reduce-scatter do their own."""
    return tuple(a for a in plan.batch_axes if a not in spec and a == DATA)  # BUG: 'data' only
