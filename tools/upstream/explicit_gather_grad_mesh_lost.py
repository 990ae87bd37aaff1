"""Explicit mode, jax 0.12.1: the gradient of a gather from a `reduced` table fails with
"When out_sharding is specified on scatter_add, operand must be unreduced along the same axes
as out_sharding" unless a mesh context is set.

Shows: a table f32[16, 4] whole on every device of an Explicit mesh data:8, made `reduced` over
'data' (typed/dp.py's free cast: its gradient comes out `unreduced`, one reshard adds it), rows
looked up by ids i32[8@data, 2] with table.at[ids].get(out_sharding=...) (jnp.take has no
sharding rule for split ids, jax#28111), and the table's gradient taken, all inside jax.jit
with NO mesh context (the arrays carry their mesh in their types, as the project's steps are
called).

Expected: f32[16,4]{U:data}, reshard to P() adds it, as on jax 0.10.2 and 0.12.0.1 and as with
a mesh context.
Actual on jax 0.12.1:
  ShardingTypeError: When out_sharding is specified on scatter_add, operand must be unreduced
  along the same axes as out_sharding. Got operand=ShapedArray(float32[16,4]), out_sharding=
  NamedSharding(..., spec=P(None, None, unreduced={'data'}, unreduced_kind=sum))
Root cause seen here: 0.12.1's gather transpose (jax/_src/lax/slicing.py
_gather_transpose_fancy) makes the scatter-add's zeros with lax.zeros_like_shaped_array of the
gradient's type, {U:data}; that broadcasts the scalar 0 with out_sharding={U:data}, and
jax/_src/lax/utils.py call_sharding_rule, seeing no mesh on the scalar nor in the context,
returns P() on the empty mesh, ignoring the out_sharding (the same rule as
explicit_vmap_scan_mesh_lost.py's C). The zeros are then not `unreduced` and scatter_add's
unreduced rule refuses them. 0.12.0.1 built the zeros with lax.full(..., sharding=...).

Project work-round: shard_parity/model/ops.py `gather_in_mesh` (the embedding lookups in
Explicit mode): a custom_vjp whose backward is JAX's own transpose of the same gather, run under
jax.sharding.use_abstract_mesh(the ids' mesh). Setting jax.set_mesh(mesh) around the call also
avoids it (shown below).

Upstream: none found. Queries tried (corpus "issues"): "scatter_add out_sharding operand must be
unreduced along the same axes as out_sharding"; (corpus "code") "operand must be unreduced along
the same axes as out_sharding scatter". Related: explicit_vmap_scan_mesh_lost.py (same rule).

Run: python tools/upstream/explicit_gather_grad_mesh_lost.py (a few seconds, CPU only).
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax

jax.config.update('jax_num_cpu_devices', 8)

import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

MESH = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Explicit,))
ROWS = NamedSharding(MESH, P('data', None, None))


def loss(table, ids):
    return table.at[ids].get(out_sharding=ROWS).sum()


@jax.jit
def table_grad(table, ids):
    table = jax.reshard(table, NamedSharding(MESH, P(None, None, reduced={'data'})))
    grad = jax.grad(loss)(table, ids)
    print(f'    the gradient: {jax.typeof(grad)}')
    return jax.reshard(grad, NamedSharding(MESH, P()))  # the all-reduce


def attempt(label, table, ids, context=False):
    try:
        if context:
            with jax.set_mesh(MESH):
                y = table_grad(table, ids)
        else:
            y = table_grad(table, ids)
        print(f'  {label}: ok {jax.typeof(y)}, sum {float(y.sum())}')
        return None
    except Exception as e:  # noqa: BLE001
        line = f'{type(e).__name__}: {str(e).splitlines()[0]}'
        print(f'  {label}: {line[:200]}')
        return line


def main():
    print('jax', jax.__version__)
    table = jax.device_put(jnp.ones((16, 4)), NamedSharding(MESH, P()))
    ids = jax.device_put(jnp.arange(16).reshape(8, 2), NamedSharding(MESH, P('data')))
    error = attempt('grad of a reduced table\'s gather, no mesh context', table, ids)
    table_grad.clear_cache()
    attempt('the same under jax.set_mesh(mesh)', table, ids, context=True)
    if error and 'must be unreduced' in error:
        print(f'REPRODUCED: the gradient of a gather from a reduced table, no mesh context: {error}')
    else:
        print('NOT REPRODUCED')


if __name__ == '__main__':
    main()
