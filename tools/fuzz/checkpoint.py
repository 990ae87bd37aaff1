"""The fuzzer's checkpoint round trip (python -m tools.fuzz --checkpoint_every=K): one draw in K
also trains STEPS steps on its mesh with a twin's train_step, saves the state with the train
CLI's Orbax checkpoint (shard_parity/runtime/checkpoint.py), restores it onto another drawn
mesh (tools/fuzz/draws.py's other_mesh), and holds the restored state to the saved one: every
array equal, and the logits of both, each evaluated on one device by the same program, bitwise
equal (as parity_tests/test_composed.py::test_checkpoints_move_between_meshes does by hand).
"""

import tempfile

import jax
import numpy as np
from flax import nnx

from shard_parity import config as cfg
from shard_parity import plan as plans
from shard_parity.mesh import mesh_for
from shard_parity.runtime import checkpoint

from ..bisect.sides import place

STEPS = 3
SCHEDULE_OPTIONS = ('microbatches', 'pp_schedule', 'pp_virtual', 'cp_layout')


def round_trip(runner, start, mesh_text: str) -> str | None:
    """None where the state saved on the runner's mesh after STEPS steps comes back from the
    checkpoint on `mesh_text`'s mesh as it was; else what differs, in one line."""
    side = runner.side
    state = place(side, start.state)
    for i in range(STEPS):  # the twin's own step, its state staying on its mesh
        state, _ = runner.step(state, place(side, start.batches.batch(i), True))
    saved = {'model': start.task.name, 'model_config': cfg.to_dict(start.task.model_config),
             'train': cfg.to_dict(start.config), **side.plan.to_config()}  # fmt: skip
    p = side.plan
    # the job restarted on another slice: its plan read from the saved config, on another mesh
    # under the composed step (the schedule's options are the first mesh's: left to default)
    mesh = {a: int(n) for a, n in (part.split(':') for part in mesh_text.split(','))}
    kept = {k: v for k, v in saved.items() if k not in SCHEDULE_OPTIONS}
    plan = plans.from_config({**kept, 'strategy': 'composed', 'mesh': mesh})
    with tempfile.TemporaryDirectory(prefix='fuzz_checkpoint_') as workdir:
        with checkpoint.manager(workdir) as mngr:
            checkpoint.save(mngr, state, saved)
            mngr.wait_until_finished()
        _, graphdef, back = checkpoint.restore(workdir, mesh_for(plan), plan)
    batch = start.batches.batch(0)
    x = batch['image'] if start.task.name == 'mlp' else batch['x']  # the model's input
    wrong = difference(state, back, (start.graphdef, graphdef), x)
    return (
        wrong
        and f'checkpoint saved on {p.text()} after {STEPS} steps, restored on {mesh_text}: {wrong}'
    )


def difference(saved, restored, graphdefs, x) -> str | None:
    """What differs between a saved state and the restored one: a leaf (by path, bitwise), or
    the logits for `x` of each, evaluated on one device by the same program; None: nothing."""
    saved, restored = jax.device_get(saved), jax.device_get(restored)
    pairs = zip(jax.tree.leaves_with_path(saved), jax.tree.leaves(restored), strict=True)
    for (path, a), b in pairs:
        if np.shape(a) != np.shape(b) or not np.array_equal(a, b):
            return f'{jax.tree_util.keystr(path)} differs'
    if not np.array_equal(
        logits(graphdefs[0], saved.params, x), logits(graphdefs[1], restored.params, x)
    ):
        return 'every array equal, but the logits differ on one device'
    return None


def logits(graphdef, params, x) -> np.ndarray:
    """The model's logits for `x` on one device (the params through the host: a typed/ array
    keeps its mesh's sharding in its type, which one device's program would refuse)."""
    params = jax.device_put(params, jax.devices()[0])
    out = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, x)
    return np.asarray(out[0] if isinstance(out, tuple) else out)
