"""explicit/composed.py with the gradients not averaged over 'data': under HSDP (data x fsdp)
each replica group keeps its own rows' gradient, summed by the cast's transpose (the bug zoo)."""

from shard_parity.explicit import composed
from shard_parity.mesh import DATA, FSDP

from . import planted

planted(globals(), composed)


def averaged_over(plan, spec) -> tuple[str, ...]:
    """The batch axes a gradient (and its param, cast before `grad`) is averaged over here:
    not those it is split over, nor 'fsdp', whose gather and reduce-scatter do their own."""
    return tuple(a for a in plan.batch_axes if a not in spec and a not in (FSDP, DATA))  # BUG
