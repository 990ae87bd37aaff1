"""ZeRO-1 written by hand (--shard_optimizer_over_data, docs/zero1.md): AdamW's moments split
over 'data', the parameters whole. Two collectives replace data parallelism's all-reduce:

    scatter   the gradient reduce-scattered over 'data': each device keeps the mean of its
              1/n, where its moments are (placement.update_specs), in place of the pmean
    gather    each device's updated 1/n of every param all-gathered: the params whole again

Between them the shared update (shard_parity/step.py, make_train_step) runs on the shards:
AdamW's arithmetic on 1/n of each array. The composed step calls both (explicit/composed.py);
compare auto/zero1.py, where a placement says the same, and typed/zero1.py.
"""

import jax

from shard_parity.mesh import DATA
from shard_parity.placement import splits, state_specs, update_specs


def scatter(g, to, plan):  # g: f32[..., d, ...], this device's gradient of its rows
    d = splits(to, DATA)  # the dimension the moments split over 'data' (under HSDP, fsdp's too)
    # the reduce-scatter: the sum of every device's g, of which this device keeps [.., d/n, ..]
    return jax.lax.psum_scatter(g, DATA, scatter_dimension=d, tiled=True) / plan.size(DATA)


def gather(params, mesh, plan):
    """The all-gather of the params: each 'data' device's updated shard, concatenated."""

    def whole(w, spec):  # w: f32[..., d/n, ...] -> f32[..., d, ...]; a param kept whole as it is
        d = splits(spec, DATA)
        return w if d is None else jax.lax.all_gather(w, DATA, axis=d, tiled=True)

    shards = update_specs(params, plan, mesh)
    return jax.shard_map(
        lambda params: jax.tree.map(whole, params, shards),
        mesh=mesh,
        in_specs=(shards,),
        out_specs=state_specs(params, plan, mesh),
        # the all-gather's result is the same on every 'data' device, which shard_map's check
        # cannot infer: jax.lax.all_gather keeps its operand's varying type
        check_vma=False,
    )(params)
