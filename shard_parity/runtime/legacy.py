"""Reading a transformer checkpoint written before its blocks were stacked.

Until 2026-12-02 the transformer kept its blocks as a list: the checkpoint holds
`params/blocks/0/attn/query/kernel` f32[C, C], `.../blocks/1/...`, and so on (and the same under
the optimizer's moments). Now they are one stacked Block: `params/blocks/attn/query/kernel`
f32[L, C, C] (shard_parity/model/transformer.py). Such a checkpoint is converted on read: each
array is read whole to the host, the L layers' arrays are stacked, and the result is placed as
the restoring strategy places it. Nothing is written back.
"""

import json

import jax
import numpy as np
import orbax.checkpoint as ocp

from shard_parity.placement import STACKED


def _saved_paths(mngr, step: int) -> list[list[dict]]:
    """Every array's path in the saved state, as Orbax's metadata spells it (key, key_type)."""
    meta = json.loads((mngr.directory / str(step) / 'state' / '_METADATA').read_text())
    return [v['key_metadata'] for v in meta['tree_metadata'].values()]


def per_layer(mngr, step: int) -> bool:
    """Whether checkpoint `step` keeps the blocks one by one (blocks/0/...), as before."""
    for path in _saved_paths(mngr, step):
        keys = [k['key'] for k in path]
        if STACKED in keys[:-1] and keys[keys.index(STACKED) + 1].isdigit():
            return True
    return False


def _restore_args(paths: list[list[dict]]):
    """A tree like the saved one (lists where Orbax saved a sequence: key_type 1), each leaf
    asking for a host numpy array: the saving mesh plays no part."""
    root: dict = {}
    for path in paths:
        node = root
        for k in path[:-1]:
            node = node.setdefault((k['key'], k['key_type']), {})
        node[(path[-1]['key'], path[-1]['key_type'])] = ocp.RestoreArgs(restore_type=np.ndarray)

    def build(node):
        if not isinstance(node, dict):
            return node
        if all(kind == 1 for _, kind in node):  # a sequence: the optimizer chain's states
            return [build(node[(str(i), 1)]) for i in range(len(node))]
        return {key: build(child) for (key, _), child in node.items()}

    return build(root)


def restore(mngr, step: int, target):
    """Checkpoint `step` (per-layer blocks) into `target` (ShapeDtypeStructs of the stacked
    layout, with their shardings)."""
    args = _restore_args(_saved_paths(mngr, step))
    read_as_saved = ocp.args.PyTreeRestore(restore_args=args)
    saved = mngr.restore(step, args=ocp.args.Composite(state=read_as_saved))['state']
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)

    def read(path, node=saved):
        for k in path:
            node = node[k]
        return node

    def convert(path, want):
        keys = [getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', None))) for k in path]
        if STACKED in keys:
            at = keys.index(STACKED) + 1
            value = np.stack([read([*keys[:at], str(i), *keys[at:]]) for i in range(want.shape[0])])
        else:
            value = read(keys)
        assert value.shape == want.shape, (keys, value.shape, want.shape)
        return jax.device_put(value.astype(want.dtype), want.sharding)

    return jax.tree_util.tree_unflatten(treedef, [convert(p, w) for p, w in leaves])
