"""`--from=WORKDIR[@STEP]`: the bisector starts from a train run's checkpoint, not the seed.

Twins (cli.py): both sides start from the checkpoint's state (parameters, AdamW's state, the
step), each placed on its side of the flags' mesh (--mesh, --strategy), under the run's
precision policy unless --dtype or --reduce_dtype choose another. The checkpoint's saved config
is the model and the training settings (the schedule, the batch, the seed): a flag that says
otherwise is refused, naming the fields. The batches are those the run takes next: the train
loop (shard_parity/runtime/loop.py) trains step i on the task's train_batches.batch(i), i
counted from the restored state's step, and the bisector's step i takes the same batch
(divergence.bisect from start = that step).
Runs (runs.py): STEP picks which checkpoint, of those both runs hold, the replay starts from.
"""

import dataclasses
import pathlib
from typing import Any

import jax
from absl import flags

from shard_parity import UsageError
from shard_parity import config as cfg
from shard_parity.runtime import checkpoint
from shard_parity.runtime import flags as F
from shard_parity.runtime.saved import DEFAULTS, POLICY, RESUMABLE, tupled, tuples


@dataclasses.dataclass
class Start:
    value: str  # --from as given
    workdir: str
    step: int  # the checkpoint's step: how many steps its state has trained
    saved: dict  # its config (model, model_config, train)
    state: Any  # TrainState of numpy arrays


def parse(value: str) -> tuple[str, int | None]:
    """(WORKDIR, STEP or None: the newest) of --from=WORKDIR[@STEP]."""
    workdir, at, step = value.rpartition('@')
    if not at:
        return value, None
    try:
        return workdir, int(step)
    except ValueError:
        saved = checkpoint.steps(workdir) if workdir else []
        raise UsageError(
            f'--from={value}: {step!r} after @ is not a step number; give WORKDIR (its newest '
            f'checkpoint) or WORKDIR@STEP, a step it saved ({saved or "none"})'
        ) from None


def chosen_step(value: str, workdir: str, step: int | None, saved: list[int]) -> int:
    """`step`, or the newest of `saved`; refuses a folder without checkpoints or a step that
    was not saved, in one line."""
    if not saved:
        raise UsageError(
            f'--from={value}: no checkpoint in {pathlib.Path(workdir) / "checkpoints"}; train '
            f'with --workdir={workdir} first (--checkpoint_every=N saves every N steps)'
        )
    if step is not None and step not in saved:
        raise UsageError(f'--from={value}: step {step} was not saved; saved steps: {saved}')
    return saved[-1] if step is None else step


def read(value: str) -> Start:
    """The checkpoint --from names, read as numpy (whatever mesh wrote it); its model and
    training settings adopted as the flags' (`adopt`)."""
    workdir, step = parse(value)
    step = chosen_step(value, workdir, step, checkpoint.steps(workdir))
    saved, _, state = checkpoint.read_numpy(workdir, step)
    adopt(value, step, saved)
    return Start(value, workdir, step, saved, state)


def fields(saved: dict) -> dict:
    """flag -> the checkpoint's value, for every flag that defines its model (the policy
    aside: each side keeps --dtype and --reduce_dtype) or its training (but --steps, which
    here says how many steps to compare, and --log_every, --eval_every)."""
    out = {'model': saved['model']}
    if saved['model'] == 'transformer':
        for holder in F.TRANSFORMER_SHAPE:
            if holder.name not in POLICY:
                out[holder.name] = saved['model_config'].get(
                    holder.name, DEFAULTS['model_config'].get(holder.name)
                )
    for name in F.TRAIN:
        if name not in RESUMABLE:
            out[name] = saved['train'].get(name, DEFAULTS['train'].get(name))
    return out


def adopt(value: str, step: int, saved: dict) -> None:
    """Refuses a flag given that differs from the checkpoint (naming each); then sets the
    flags to the checkpoint's model, so that the plan is built and checked for it, and to its
    precision policy where --dtype and --reduce_dtype are not given. The batch
    size is set only where it is not the model's default, so that a default batch that does
    not split over every device still trains on fewer, as the train CLI did."""
    values = fields(saved)
    given = {n: flags.FLAGS[n].value for n in values if flags.FLAGS[n].present}
    diffs = [f'--{n}: checkpoint {values[n]}, given {v}' for n, v in given.items()
             if tupled(v) != tupled(values[n])]  # fmt: skip
    if diffs:
        raise UsageError(
            f'--from={value}: checkpoint {step} is of another model or training than the flags '
            f'say: {"; ".join(diffs)}. --from takes them from the checkpoint: drop those flags'
        )
    flags.FLAGS['model'].value = saved['model']
    for name in POLICY:  # the run's precision policy, unless the flags choose one
        if not flags.FLAGS[name].present and saved['model_config'].get(name):
            flags.FLAGS[name].value = saved['model_config'][name]
    for name, v in values.items():
        if name in F.TRAIN:
            default = getattr(cfg.TRAIN_DEFAULTS[saved['model']], name)
            if name == 'batch_size' and v != default:
                flags.FLAGS[name].value = v
        elif name != 'model':
            flags.FLAGS[name].value = v


def train_config(saved: dict) -> cfg.TrainConfig:
    """The run's own training settings, its --steps included: the schedule the run had."""
    return cfg.TrainConfig(**saved['train'])


def shape(saved: dict, flagged):
    """The checkpoint's model configuration under the flags' policy (`flagged`, the flags'
    model configuration: its dtype and reduce_dtype)."""
    mine = tuples(saved['model_config'])
    policy = {k: getattr(flagged, k) for k in POLICY if hasattr(flagged, k)}  # the MLP: no remat
    return type(flagged)(**{**mine, **policy})


def state(begin: Start, initial):
    """The checkpoint's state, refused in one line if it is not the state of the model the
    flags build (`initial`, its freshly initialised state)."""
    if jax.tree.structure(begin.state) != jax.tree.structure(initial):
        raise UsageError(
            f'--from={begin.value}: checkpoint {begin.step} holds another state than its '
            'config builds (a checkpoint of another version of this project?)'
        )
    return begin.state


def note(begin: Start) -> str:
    s = begin.step
    return (
        f'both sides start from checkpoint {s} of {begin.workdir} (its state after {s} steps, '
        f'its model and training settings): the first step compared is step {s} (counted from '
        f'0, as here; the run logs it as step {s + 1}), on the batch the run takes next'
    )
