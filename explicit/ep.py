"""Expert parallelism written by hand: each token goes to its expert's device and back, two
all_to_all lines of this file per MoE layer.

On a DATA x EXPERT mesh (`--mesh=2x4`) the rows are split over both axes (`P(('data',
'expert'))`: B/(d n) whole sequences per device), each expert's weights live on one device of
the 'expert' axis (`P(None, 'expert')` of the stacked f32[L, E, ...]: E/n experts each), and
every other weight is whole on every device, as in dp. Each device routes its own tokens
(shard_parity/model/moe.py: top-K, capacity per sequence, so the same drops on any mesh) and
gathers them per expert, xe: [E, B/(d n), cap, C]. `exchange` below sends expert e's slots to
the device holding e and receives, from each of the n devices of its 'expert' group, the slots
of its own E/n experts; they run there, and the outputs go back the same way. The gradients of
the experts stay where the experts live; the others are averaged, as dp's. Compare auto/ep.py.
"""

import jax

from shard_parity.mesh import DATA, EXPERT
from shard_parity.placement import REPLICATED, is_expert, rows, state_specs
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'ep'  # --strategy=ep: experts split over 'expert', the rows over both axes


def exchange(xe, experts):  # xe: [E, b, cap, C], my b rows' slots for every expert
    # the first all-to-all: expert e's slots to the device holding it; in come my E/n experts'
    # slots from all n devices of my 'expert' group, side by side: [E/n, n b, cap, C]
    x = jax.lax.all_to_all(xe, EXPERT, split_axis=0, concat_axis=1, tiled=True)
    y = experts(x)  # my E/n experts on every slot they were sent
    # the second all-to-all: each output back to the device its token came from: [E, b, cap, C]
    return jax.lax.all_to_all(y, EXPERT, split_axis=1, concat_axis=0, tiled=True)


def average(grads, n: int):
    """The experts' gradients summed over 'data' (each of the d copies of an expert saw other
    rows; the all-to-all's transpose already added its group's n devices' terms), as the mean
    over all d n devices' losses; every other gradient averaged over both axes, as dp's."""
    return jax.tree_util.tree_map_with_path(
        lambda p, g: (
            jax.lax.pmean(g, DATA) / n if is_expert(p) else jax.lax.pmean(g, (DATA, EXPERT))
        ),
        grads,
    )


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    hook = bind(graphdef, loss_fn, experts=exchange)
    grad_fn = jax.value_and_grad(hook, has_aux=True)

    def local(params, batch):  # params: whole, experts E/n each; batch: x[B/(d n), T]
        # As dp's pcast: varying over the axes each array is not yet split over, so that `grad`
        # returns this device's own gradient (the experts are varying over 'expert' already).
        params = jax.tree_util.tree_map_with_path(
            lambda p, w: jax.lax.pcast(w, DATA if is_expert(p) else (DATA, EXPERT), to='varying'),
            params,
        )
        # the loss and gradient of my rows
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return jax.lax.pmean(metrics, (DATA, EXPERT)), average(grads, mesh.shape[EXPERT])

    def fn(params, batch):  # the rows over both axes; each device's experts, the rest whole
        specs = state_specs(params, plan, mesh)
        return jax.shard_map(
            local, mesh=mesh, in_specs=(specs, rows(plan)), out_specs=(REPLICATED, specs)
        )(params, batch)

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates the arrays or experts it holds
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn, experts=exchange)

    def evaluate(params, batch):  # per-example outputs of my rows; the tokens still travel
        specs = state_specs(params, plan, mesh)
        return jax.shard_map(fn, mesh=mesh, in_specs=(specs, rows(plan)), out_specs=rows(plan))(
            params, batch
        )

    return jax.jit(evaluate)
