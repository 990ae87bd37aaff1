"""What every twin shares, so that a difference between twins can only come from the twins.

    mesh.py       the DATA x MODEL mesh, emulated CPU devices
    placement.py  where each array lives under each strategy, and the placing itself
    step.py       TrainState, AdamW, apply_gradients, the one-device step
    model/        the MLP, the transformer, attention and the custom-backward ops
    runtime/      configs, flags, tasks, the loop, checkpoints, reports, processes, the CLIs

The parallelism itself lives in the twins' strategy files (auto/dp.py, explicit/fsdp.py, ...);
nothing in this package imports them.
"""


class UsageError(Exception):
    """An expected bad input: the CLI prints its one-line message and exits non-zero."""
