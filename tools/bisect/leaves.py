"""How two trees of arrays differ, leaf by leaf, and what a difference points to: the
comparisons of the bisector (tools/bisect/divergence.py: activations, gradients, updated state)
and of its run-directory mode (tools/bisect/runs.py: logged figures).

A leaf differs when some element is off by more than rtol x itself + atol x the leaf's largest
magnitude (NaN always differs); a ratio B / A that is the same everywhere, or rows that differ on
some devices only, are named, and `hints` says what such a pattern usually means. Under
--tolerance=model (shard_parity/numerics.py) a leaf differs when its norm-wise relative error
exceeds its budget, which the caller gives."""

import dataclasses
import itertools
import math

import jax
import numpy as np

from shard_parity import numerics
from shard_parity.mesh import MODEL
from shard_parity.plan import BATCH_AXES, ROWS

# (rtol, atol as a fraction of the leaf's largest magnitude) per --tolerance
TOLERANCES = {'f32': (1e-5, 1e-6), 'bitwise': (0.0, 0.0), 'x64': (1e-9, 1e-11)}


@dataclasses.dataclass
class Leaf:
    path: str
    max_abs: float
    max_rel: float
    ratio: float | None = None  # B / A, when constant over the leaf
    shapes: tuple | None = None  # (A's, B's) when they differ
    dtypes: tuple | None = None  # (A's, B's) when they differ where they must not (the state)
    blocks: list | None = None  # which devices' rows differ, when only some do
    error: float | None = None  # --tolerance=model: ||A - B|| / max(||A||, ||B||)
    budget: float | None = None  # ...and the error model's budget for it

    @property
    def budgets(self) -> float | None:
        """How many budgets the error is (--tolerance=model)."""
        if self.error is None or not self.budget:
            return None
        return self.error / self.budget


def compare(path, a, b, tolerance, n_rows=1, budget=None, seen=None) -> Leaf | None:
    """None when a and b agree under `tolerance`; else how they differ. Under 'model', `budget`
    is the leaf's (numerics.Budget's), and (path, error / budget) goes into `seen`, a list."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return Leaf(path, float('inf'), float('inf'), shapes=(a.shape, b.shape))
    if tolerance == 'bitwise' and np.array_equal(a, b, equal_nan=True):
        return None
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = np.abs(a64 - b64)
    scale = max(np.abs(a64).max(initial=0), np.abs(b64).max(initial=0))
    if tolerance == 'model':
        err = numerics.error(a64, b64)
        if seen is not None:
            seen.append((path, err / budget if budget else math.inf * bool(err)))
        if err <= budget:
            return None
        bad = None  # which rows: the blocks whose own norm-wise error is beyond the budget
    else:
        rtol, atol = TOLERANCES[tolerance]
        bad = ~(diff <= atol * scale + rtol * np.abs(a64))  # NaN counts as differing
        if tolerance != 'bitwise' and not bad.any():
            return None
    # relative to A, where A is not round-off of the leaf's largest magnitude (an element that
    # is 0 in A would read 1e305): below float32's spacing of `scale`, relative to that spacing
    floor = max(np.finfo(np.float32).eps * scale, np.finfo(np.float64).tiny)
    rel = diff / np.maximum(np.abs(a64), floor)
    ratio = _ratio(a64, b64, scale) if tolerance != 'model' else _scale(a64, b64, budget)
    leaf = Leaf(path, float(np.nanmax(diff)), float(np.nanmax(rel)), ratio)
    if tolerance == 'model':
        leaf.error, leaf.budget = err, budget
    if n_rows > 1 and a.ndim and a.shape[0] % n_rows == 0:
        if bad is None:
            pairs = zip(a64.reshape(n_rows, -1), b64.reshape(n_rows, -1))
            per_block = np.array([numerics.error(x, y) > budget for x, y in pairs])
        else:
            per_block = bad.reshape(n_rows, -1).any(1)
        if 0 < per_block.sum() < n_rows:
            leaf.blocks = [int(i) for i in np.flatnonzero(per_block)]
    return leaf


def _scale(a, b, budget) -> float | None:
    """B / A when B is a multiple of A within the norm-wise budget (the model's `_ratio`: one
    element of a bf16 leaf can be off by far more than 1e-3)."""
    aa = float(np.vdot(a, a)) if np.isfinite(a).all() and np.isfinite(b).all() else 0.0
    if not aa:
        return None
    r = float(np.vdot(a, b)) / aa
    return r if r and numerics.error(r * a, b) <= budget else None


def _ratio(a, b, scale) -> float | None:
    """B / A where it is the same number everywhere A is not negligible."""
    big = np.abs(a) > 1e-3 * scale
    if big.sum() < 1:
        return None
    r = b[big] / a[big]
    mid = float(np.median(r))
    return mid if np.all(np.abs(r - mid) <= 1e-3 * abs(mid) + 1e-12) else None


def named_leaves(tree) -> list:
    def name(k):
        return str(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k))))

    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [('.'.join(name(k) for k in path if name(k) != 'value'), x) for path, x in flat]


def global_norm(tree) -> float:
    """Every leaf of `tree` together, one norm in float64: what AdamW's clip divides by."""
    return math.sqrt(sum(float(np.sum(np.asarray(x, np.float64) ** 2))
                         for x in jax.tree.leaves(tree)))  # fmt: skip


def compare_trees(
    prefix, a, b, tolerance, budget=None, seen=None, before=None, dtypes=False
) -> list[Leaf]:
    """The leaves of a and b that differ. With `before` (the tree a and b were made from),
    `budget` is a function of (before's leaf, b's leaf, the leaf's path): the model's budget
    of the change.
    `dtypes`: a leaf whose element type differs is a difference whatever its values."""
    out = []
    olds = [x for _, x in named_leaves(before)] if before is not None else None
    for i, ((path, x), (_, y)) in enumerate(zip(named_leaves(a), named_leaves(b), strict=True)):
        if dtypes and np.dtype(x.dtype) != np.dtype(y.dtype):
            kinds = (np.dtype(x.dtype).name, np.dtype(y.dtype).name)
            out.append(Leaf(f'{prefix}{path}', math.inf, math.inf, dtypes=kinds))
            continue
        allowed = budget(olds[i], y, path) if olds is not None and budget else budget
        leaf = compare(f'{prefix}{path}', x, y, tolerance, budget=allowed, seen=seen)
        if leaf:
            out.append(leaf)
    return out


# --- what a constant ratio or a per-device pattern points to ---


def hints(leaf: Leaf, a, b) -> list[str]:
    """What `leaf`'s difference between sides a and b (sides.Side) points to."""
    sizes = {  # an axis a mesh lacks: size 1
        ax: sorted({s.mesh.shape.get(ax, 1) for s in (a, b) if s.mesh} - {1})
        for ax in (*ROWS, MODEL)
    }
    out = []
    if leaf.shapes and len(leaf.shapes[0]) and leaf.shapes[0][1:] == leaf.shapes[1][1:]:
        k = leaf.shapes[1][0] / leaf.shapes[0][0]
        for (big, n), ax in itertools.product((('B', k), ('A', 1 / k)), ROWS):
            if n in sizes[ax]:
                out.append(
                    f"{big} has {int(n)}x the rows, the '{ax}' axis size: in {big} the batch is "
                    f"replicated where it should be split (an in_spec P() for the batch, not "
                    f"P('{ax}')): every device works on the whole batch"
                )
    r = leaf.ratio
    for axes, n in batch_groups(a, b) if r else ():
        named = ' x '.join(f"'{ax}'" for ax in axes)
        named = f'the {named} axis size' if len(axes) == 1 else f'the size of {named}'
        for big, k in (('B', r), ('A', 1 / r)):
            if abs(k - n) <= 1e-3 * n:
                out.append(
                    f"{big} is {n}x the other, {named}: in {big} a sum where a mean "
                    'belongs (psum for pmean, or a reduce-scatter without its division by n), or '
                    'a missing pcast(..., to=\'varying\') before grad, whose transpose is a psum'
                )
    for m in sizes[MODEL] if r else ():
        for small, k in (('B', r), ('A', 1 / r)):
            if abs(k * m - 1) <= 1e-3:
                out.append(
                    f"{small} is the other / {m}, the 'model' axis size: in {small} a mean where "
                    "a psum belongs (pmean over 'model' for tensor parallelism's psum)"
                )
    if leaf.blocks:
        out.append(
            f'only the rows of devices {leaf.blocks} differ: a per-device random key (a dropout '
            'or init key that is the same on every device where each needs its own rows, or '
            'folded with axis_index where the global draw was meant)'
        )
    return out


def batch_groups(a, b) -> list[tuple[tuple[str, ...], int]]:
    """(axes, the product of their sizes) for each set of batch axes (the rows', and 'seq') of
    either side's mesh: a gradient summed over those axes where the loss is a mean over them is
    that product times too large (on data:2,fsdp:2 a sum over both is 4x)."""
    out = set()
    for mesh in (s.mesh for s in (a, b) if s.mesh):
        axes = [ax for ax in mesh.axis_names if ax in BATCH_AXES and mesh.shape[ax] > 1]
        for k in range(1, len(axes) + 1):
            for group in itertools.combinations(axes, k):
                out.add((group, math.prod(mesh.shape[ax] for ax in group)))
    return sorted(out, key=lambda g: (len(g[0]), g))
