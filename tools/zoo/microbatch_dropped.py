"""explicit/pp.py with the last microbatch's backward skipped (the bug zoo): its output leaves
the pipeline under stop_gradient, as a hand-written schedule whose backward loop runs M - 1
times. The forward and the loss are right; the blocks' and the embeddings' gradients miss one
microbatch of M on every 'data' device, the head's do not. With --microbatches=16: one of 16
dropped, about 1/16 of those gradients at initialisation, where the microbatches' gradients
mostly agree, and more once training leaves mostly their noise."""

import jax
import jax.numpy as jnp

from shard_parity.explicit import pp
from shard_parity.explicit.pp import pass_on
from shard_parity.mesh import STAGE
from shard_parity.pipeline import feed, join, microbatch_means, split

from . import planted


def without_last_backward(ys):
    """`ys` [ticks, ...] with its last tick's (the last stage's last microbatch's) gradient cut."""
    return ys.at[-1].set(jax.lax.stop_gradient(ys[-1]))


planted(globals(), pp)


def pipeline(plan, mesh):
    """The model's `pipeline`: x f32[B/d, T, C] through all L layers, S stages, GPipe."""
    microbatches = plan.microbatches  # --microbatches: M, each row device's rows cut into M

    def run(x, run_stack, weights):  # weights: my stage's L/S layers, [L/S, ...]
        s, n = jax.lax.axis_index(STAGE), mesh.shape[STAGE]
        # Varying over 'stage': else grad sums stage 0's input gradient over 'stage' every tick
        inputs = jax.lax.pcast(split(x, microbatches), STAGE, to='varying')  # [M, B/dM, T, C]

        def tick(h, x):  # h: what the previous stage passed me last tick; x: stage 0's input
            y, stats = run_stack(weights, jnp.where(s == 0, x, h))  # stage 0: a new one
            return pass_on(y, mesh, plan), (y, stats)  # a collective-permute

        h = jnp.zeros_like(inputs[0])  # bubbles: zeros
        _, (ys, stats) = jax.lax.scan(tick, h, feed(inputs, n))  # [M+S-1, B/dM, T, C]
        ys = without_last_backward(ys)  # BUG: the last microbatch's backward skipped
        means = microbatch_means(stats, microbatches, s)  # experts' statistics: my layers'
        # the last stage's, from tick S - 1 on, to every stage: an all-reduce over 'stage'
        # ...and all layers' means: an all-reduce over 'stage'
        return join(jax.lax.psum(jnp.where(s == n - 1, ys[n - 1 :], 0), STAGE)), {
            k: jax.lax.pmean(v.mean(), STAGE) for k, v in means.items()
        }

    return run
