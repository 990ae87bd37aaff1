"""One recorded chip step (checkpoints k, k+1) against the same step live on this CPU."""
import sys, numpy as np, jax
jax.config.update('jax_num_cpu_devices', 1)
from flax import nnx
from shard_parity.runtime import checkpoint
from shard_parity.step import make_optimizer, one_device_train_step, TrainState, create_state
from tools.bisect.runs import make_task
from tools.bisect.trained import train_config

def step_on_cpu(workdir, k, precision=None):
    saved, graphdef, s0 = checkpoint.read_numpy(workdir, k)
    config = train_config(saved)
    task = make_task(saved, config)
    tx = make_optimizer(config)
    graphdef2, init = create_state(task.make_model(nnx.Rngs(config.seed)), tx)
    step = one_device_train_step(graphdef2, task.loss_fn, tx)
    batch = task.train_batches.batch(k)
    state = jax.tree.map(jax.numpy.asarray, s0)
    if precision:
        with jax.default_matmul_precision(precision):
            new, m = step(state, batch)
    else:
        new, m = step(state, batch)
    return s0, jax.device_get(new), init

for w in sys.argv[1:]:
    s0, cpu1, init = step_on_cpu(w, 0)
    _, _, chip1 = checkpoint.read_numpy(w, 1)
    same_init = all(np.array_equal(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(s0.params), jax.tree.leaves(init.params)))
    print(f'== {w}: chip init == cpu init bitwise: {same_init}')
    P0, Pc, Pt = (jax.tree_util.tree_leaves_with_path(x.params) for x in (s0, cpu1, chip1))
    for (path, p0), (_, pc), (_, pt) in zip(P0, Pc, Pt):
        p0, pc, pt = (np.asarray(x, np.float64) for x in (p0, pc, pt))
        upd = np.linalg.norm(pt - p0)
        d = np.linalg.norm(pc - pt)
        print(f'  {jax.tree_util.keystr(path)[:60]:60s} |step| {upd:.3e}  |cpu-chip| {d:.3e}  rel to step {d / max(upd, 1e-30):.3e}')
