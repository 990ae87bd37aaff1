"""Explicit mode: reshape puts a size-1 mesh axis on the wrong dimension (heads -> features).

Shows: an array f32[B, T, H*D] whose last dimension is split over a mesh axis 'model' of SIZE 1
(mesh data:8, model:1, all axes Explicit), reshaped to [B, T, H, D] with H = 1 (one key-value
head). JAX's reshape sharding rule treats this as a "singleton" reshape
(jax/_src/lax/lax.py `_split_merge_singleton_dim_sharding_rule`: the non-1 dimensions match, so
every new dimension of size 1 gets None and the spec moves to the next non-1 dimension).

Expected: f32[B, T, 1@model, D] (P('data', None, 'model', None)): the split stays on the heads,
as with any H > 1 (a mesh axis of size 1 divides a dimension of size 1 too).
Actual (jax 0.10.2 and 0.12.0.1): f32[B, T, 1, D@model]. Consequences:
  - next to queries split on their heads (H = 2: [B, T, 2@model, D]), the attention's
    p @ v einsum 'bhts,bskd->bthd' raises ShardingTypeError "dot_general operation with inputs:
    ... produces an illegally sharded result: f32[8@data,16@model,2@model,4]" ('model' twice);
  - with H = 1 on both sides, 'bthd,bshd->bhts' raises ShardingTypeError "Contracting
    dimensions are sharded and it is ambiguous how the output should be sharded ...";
  - the inverse merge [B, T, 1@model, D] -> [B, T, D] drops 'model' (f32[B, T, D]).

Project work-round: shard_parity/model/ops.py `split` / `merge` pass an explicit out_sharding to
jax.lax.reshape in Explicit mode (the split on the first new dimension; merge keeps the first
merged dimension's); commit f2ec942 ("JAX's reshape rule skips a dimension of size 1").

Upstream: no matching issue found. Related, not the same bug: jax-ml/jax#39309 "JAX 0.11
regression: reshape drops a size-1 explicit mesh axis, causing sharding mismatch in concatenate"
(https://github.com/jax-ml/jax/issues/39309, closed; a size-1 *mesh axis on a size-1 dimension*
dropped by the split rule in 0.11.0; its reproducer passes on both 0.10.2 and 0.12.0.1 here).
marin-community/marin#7247 uses the same work-round (explicit out_sharding on head split/merge)
for a different trigger. Queries tried (corpus "issues"): "explicit sharding reshape size 1 mesh
axis", "reshape sharding rule split dimension explicit mode", "reshape singleton dimension
sharding dropped explicit mode size 1 ...", "dot_general produces an illegally sharded result
reshape heads", "explicit sharding reshape split heads dimension of size 1 ...".

Run: python tools/upstream/explicit_reshape_size1_axis.py (a few seconds, CPU only).
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax

jax.config.update('jax_num_cpu_devices', 8)

import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

B, T, D = 8, 4, 16


def attempt(label, fn, *args):
    """fn(*args)'s type, or the first line of what it raised."""
    try:
        out = fn(*args)
        print(f'  {label}: ok {jax.typeof(out)}')
        return None
    except Exception as e:  # noqa: BLE001
        line = f'{type(e).__name__}: {str(e).splitlines()[0]}'
        print(f'  {label}: {line[:240]}')
        return line


def main():
    print('jax', jax.__version__)
    mesh = jax.make_mesh((8, 1), ('data', 'model'), axis_types=(AxisType.Explicit,) * 2)
    found = {}
    with jax.set_mesh(mesh):
        k = jax.device_put(jnp.ones((B, T, 1 * D)), P('data', None, 'model'))  # one kv head
        q = jax.device_put(jnp.ones((B, T, 2 * D)), P('data', None, 'model'))  # two heads

        @jax.jit
        def run(q, k):
            k4 = k.reshape(B, T, 1, D)
            q4 = q.reshape(B, T, 2, D)
            spec = jax.typeof(k4).sharding.spec
            print(
                f'  split [B,T,1*D@model] -> {jax.typeof(k4)}  (expected f32[8@data,4,1@model,16])'
            )
            found['split'] = tuple(spec) != ('data', None, 'model', None)
            print(f'  split [B,T,2*D@model] -> {jax.typeof(q4)}  (control: H=2 keeps heads)')
            p = jnp.einsum('bthd,bskd->bhts', q4, k4)
            found['pv'] = attempt(
                "einsum 'bhts,bskd->bthd' (p @ v)", jnp.einsum, 'bhts,bskd->bthd', p, k4
            )
            found['qk'] = attempt(
                "einsum 'bthd,bshd->bhts' (H=1 both)", jnp.einsum, 'bthd,bshd->bhts', k4, k4
            )
            back = jnp.ones((B, T, 1, D), out_sharding=P('data', None, 'model', None))
            merged = back.reshape(B, T, D)
            print(
                f'  merge [B,T,1@model,D] -> {jax.typeof(merged)}  '
                '(expected f32[8@data,4,16@model])'
            )
            found['merge'] = 'model' not in str(jax.typeof(merged))
            # the work-round: say the split's sharding
            out = NamedSharding(mesh, P('data', None, 'model', None))
            k5 = jax.lax.reshape(k, (B, T, 1, D), out_sharding=out)
            p5 = jnp.einsum('bthd,bskd->bhts', q4, k5)
            found['fix'] = attempt(
                'work-round (lax.reshape out_sharding), p @ v',
                jnp.einsum,
                'bhts,bskd->bthd',
                p5,
                k5,
            )
            return p

        run(q, k)
    if found.get('split') and found.get('pv'):
        why = found['pv'].split('produces')[-1].strip()
        print(
            "REPRODUCED: reshape [B,T,1*D@model:1] -> [B,T,1,D@model] ('model' moved off the "
            f"head); the p @ v einsum then raises ShardingTypeError: ... produces {why}"
        )
    else:
        print('NOT REPRODUCED')


if __name__ == '__main__':
    main()
