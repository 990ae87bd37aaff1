"""The averaging window of the train lines, and how a checkpoint keeps it.

A train line of metrics.jsonl is each figure's mean over the steps since the previous line (the
loop in shard_parity/runtime/loop.py). A checkpoint keeps those steps' values, at most
--log_every scalars per figure, so that a resumed run adds the very numbers, in the very order,
that an undisturbed run adds: a partial sum continued later would add in another order and miss
the bits. Each value (float32) is exact as a JSON number.
"""

import jax
import jax.numpy as jnp
import numpy as np

from shard_parity import UsageError


def window_record(window: list, step: int) -> dict:
    """The averaging window as a checkpoint keeps it (JSON): each step's figures since the last
    train line, in order, with their dtypes. A float32 (or bfloat16) value is exact as a JSON
    number, so the window read back is bitwise the one saved."""
    values = [{k: np.asarray(v) for k, v in m.items()} for m in window]
    return {
        'step': step,
        'dtypes': {k: v.dtype.name for k, v in values[0].items()} if values else {},
        'values': [{k: float(v) for k, v in m.items()} for m in values],
    }


def window_from_record(record: dict, step: int) -> list:
    """The window `window_record` saved at `step`, as host arrays of their dtypes."""
    if record.get('step') != step:
        raise UsageError(f'the averaging window saved with checkpoint {step} is of step '
                         f'{record.get("step")}: the checkpoint is inconsistent')
    dtypes = {k: jnp.dtype(d) for k, d in record['dtypes'].items()}
    return [{k: np.asarray(v, dtypes[k]) for k, v in m.items()} for m in record['values']]


def means(window: list) -> dict:
    """Each figure's mean over the window, in its dtype (float32), in the order of the steps."""
    return jax.tree.map(lambda *xs: float(np.mean(np.stack([np.asarray(x) for x in xs]))), *window)
