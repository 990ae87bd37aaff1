"""The parts of a training step that do not depend on the parallelism, the choice of the file
that runs a plan, and the one-device run.

A twin's step is `loss_and_grads` (where the parallelism lives) followed by `apply_gradients`
(elementwise, the same code everywhere: each device updates the arrays or shards it holds with
the reduced gradient). `strategy_file(twin, plan)` is the one rule for which of a twin's files
runs a plan (the train loop, the bisector, the inspector and the benchmarks all ask it).
`one_device_train_step` is the plain `jit` on one device (donating its state, as the twins do)
that every twin and strategy is tested against.
"""

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from shard_parity import UsageError
from shard_parity.model.ops import split
from shard_parity.placement import layer_dims, state_shardings, update_shardings
from shard_parity.plan import STAGE
from shard_parity.config import TrainConfig


class TrainState(NamedTuple):
    """Everything a step reads and writes: a pytree, so jit, device_put and Orbax take it whole."""

    step: jax.Array  # i32[]
    params: nnx.State
    opt_state: optax.OptState


def learning_rate(config: TrainConfig):
    """Linear warm-up, then cosine decay to min_learning_rate; a constant when neither is set."""
    end = config.learning_rate if config.min_learning_rate is None else config.min_learning_rate
    if config.warmup_steps == 0 and end == config.learning_rate:
        return config.learning_rate
    return optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, config.warmup_steps, config.decay_steps or config.steps, end
    )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """AdamW on the averaged gradient, after clipping its global norm (when grad_clip is set)."""

    def matrices_only(params):  # decay weight matrices and embeddings, not biases or norms
        # (per layer: a stacked LayerNorm scale f32[L, C] is a vector of each layer)
        return jax.tree_util.tree_map_with_path(lambda k, p: p.ndim - layer_dims(k) >= 2, params)

    adamw = optax.adamw(
        learning_rate(config),
        b2=config.beta2,
        weight_decay=config.weight_decay,
        mask=matrices_only,
    )
    chain = [optax.clip_by_global_norm(config.grad_clip)] if config.grad_clip else []
    if config.log_grad_norm:
        chain.insert(0, record_grad_norm())
    return optax.chain(*chain, adamw) if chain else adamw


class GradNormState(NamedTuple):
    norm: jax.Array  # f32[]: the global norm of the last gradient


def record_grad_norm() -> optax.GradientTransformation:
    """Keeps the global norm of the (reduced) gradient in its state, for --log_grad_norm. Under
    a strategy that shards the gradient this costs XLA a scalar all-reduce per sharded array,
    which is why it is off by default: it changes the collectives the inspector pins."""
    return optax.GradientTransformation(
        lambda params: GradNormState(jnp.zeros((), jnp.float32)),
        lambda updates, state, params=None: (updates, GradNormState(optax.tree.norm(updates))),
    )


def with_grad_norm(metrics: dict, opt_state) -> dict:
    """`metrics`, plus 'grad_norm' where the optimizer records one (record_grad_norm)."""
    if isinstance(opt_state, tuple) and opt_state and isinstance(opt_state[0], GradNormState):
        return {**metrics, 'grad_norm': opt_state[0].norm}
    return metrics


def create_state(model: nnx.Module, tx: optax.GradientTransformation):
    """Splits a freshly initialised model into its static graph and a TrainState."""
    graphdef, params = nnx.split(model)
    return graphdef, TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))


def apply_gradients(state: TrainState, grads, tx) -> TrainState:
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)  # float32 masters
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state)


def make_train_step(
    grads_fn: Callable, tx, mesh, plan, place: Callable = jax.lax.with_sharding_constraint,
    gather: Callable | None = None,
) -> Callable:  # fmt: skip
    """The train step every strategy file builds from its `loss_and_grads`: the gradients, then
    the update, which is elementwise and so the same code for every strategy (each device
    updates the arrays or shards it holds). The new state is constrained to the placement the
    old one had (`place`: typed/ passes `jax.reshard`, the only way to move data on an Explicit
    mesh), and the old one is donated, so its buffers are reused.
    ZeRO-1 (`plan.zero1`, docs/zero1.md): the gradients arrive split as AdamW's moments
    (placement.update_specs); the params are cut to the same shards (a local slice), updated
    there, 1/n of each, and `gather(params, mesh, plan)`, the twin's zero1.gather, makes them
    whole again: the step's one all-gather of the params."""

    def step(state: TrainState, batch):
        metrics, grads = grads_fn(state.params, batch)
        if plan.zero1:  # this device's shard of every param: no communication
            shards = update_shardings(state.params, mesh, plan)
            state = state._replace(params=place(state.params, shards))
        state = apply_gradients(state, grads, tx)
        if plan.zero1:  # the all-gather of the updated params (the moments stay split)
            state = state._replace(params=gather(state.params, mesh, plan))
        metrics = with_grad_norm(metrics, state.opt_state)
        return place(state, state_shardings(state, mesh, plan)), metrics

    return jax.jit(step, donate_argnums=0)


def as_dtype(tree, dtype):
    """Every floating array of `tree` as `dtype`: the precision policy's cast beside each
    collective (the plan's `precision`: weights gathered in the compute dtype, gradients
    reduced in the reduce dtype). Arrays already `dtype`, and integer ones, as they are."""

    def cast(x):
        floating = jnp.issubdtype(x.dtype, jnp.floating)
        return x.astype(dtype) if floating and x.dtype != jnp.dtype(dtype) else x

    return jax.tree.map(cast, tree)


INTERFACE = ('loss_and_grads', 'train_step', 'eval_step')  # what a strategy file defines


class NarrowReduce(UsageError):
    """--reduce_dtype below float32 in a twin whose REDUCES_NARROW is false. `reason` is the
    refusal; `fix`, what to do, is the train CLI's unless its caller (the bisector, the
    inspector) says its own."""

    def __init__(self, twin: str, reduce: str, fix: str | None = None):
        self.twin, self.reduce = twin, reduce
        self.reason = (
            f'--reduce_dtype={reduce} in the {twin} twin: its partitioner reduces each gradient '
            'where it is formed, before any line of the twin can cast it'
        )
        fix = fix or 'use explicit.train (a cast beside each collective) or drop --reduce_dtype'
        super().__init__(f'{self.reason}; {fix}')


def strategy_file(twin, plan, module=None):
    """The module that runs `plan` in `twin` (a twin package: auto, explicit, typed): the file
    of its --pp_schedule under 1f1b and interleaved (SCHEDULES: on every mesh with a stage axis,
    named ones included), else STRATEGIES[plan.strategy].
    `module` overrides the choice: a twin package is chosen from in the same way; any other
    module (a zoo entry, a file of yours) runs as it is, if it defines INTERFACE. Every file
    takes the plan whole: `train_step(graphdef, loss_fn, tx, mesh, plan)`. A twin package
    whose REDUCES_NARROW is false refuses a --reduce_dtype below float32 in one line."""
    chosen = module if module is not None else twin
    if hasattr(chosen, 'STRATEGIES'):
        reduce = plan.precision.reduce
        if jnp.finfo(reduce).bits < 32 and not getattr(chosen, 'REDUCES_NARROW', True):
            raise NarrowReduce(getattr(chosen, 'NAME', chosen.__name__), reduce)
        if plan.schedule != 'gpipe' and plan.uses(STAGE):
            return chosen.SCHEDULES[plan.schedule]
        if plan.strategy not in chosen.STRATEGIES:
            raise UsageError(f'{chosen.__name__} has no --strategy={plan.strategy}')
        return chosen.STRATEGIES[plan.strategy]
    missing = [f for f in INTERFACE if not callable(getattr(chosen, f, None))]
    if missing:
        raise UsageError(
            f'{chosen.__name__} has no {", ".join(f + "()" for f in missing)}: a strategy module '
            f'defines {", ".join(INTERFACE)} (as explicit/dp.py does)'
        )
    return chosen


def bind(graphdef, fn: Callable, **call) -> Callable:
    """Turns `fn(model, batch)` into `fn(params, batch)`: the form `grad` differentiates.
    `call` goes into every call of the model (explicit/tp.py passes its `sum_partials`)."""

    def bound(params, batch):
        model = nnx.merge(graphdef, params)
        return fn(functools.partial(model, **call) if call else model, batch)

    return bound


# --- Gradient accumulation: K microbatches per optimizer step (docs/accumulation.md). ---


SHARE = 'accumulated_share'  # a microbatch's 1/K, which Accumulated scales its loss by


@dataclasses.dataclass(frozen=True)
class Accumulated:
    """A task's loss, `fn(model, batch)`, marked to run over `steps` microbatches of each
    batch (--gradient_accumulation_steps=K). Called, it is `fn` on what it is given (the
    one-device run calls it on the whole batch: the reference every twin is tested against),
    scaled by the batch's SHARE when `accumulate` gives it one."""

    fn: Callable
    steps: int = 1

    def __call__(self, model, batch):
        if SHARE not in batch:
            return self.fn(model, batch)
        share = batch[SHARE]
        loss, metrics = self.fn(model, {k: v for k, v in batch.items() if k != SHARE})
        return loss * share, jax.tree.map(lambda m: m * share, metrics)


def microbatches(batch, k: int):
    """[B, ...] -> [K, B/K, ...], row r in microbatch r % K: a device's block of rows (B/n of
    them, K dividing B/n) splits into K strided parts on that device, so the split moves no
    data in any twin and gives the same microbatches whether the rows are global or local.
    In Explicit mode the rows' split stays on B/K (ops.split, as pipeline.split): JAX's reshape
    rule dropped an fsdp of 1 from rows split over data x fsdp, and typed/composed.py's
    contraction then refused its unreduced axes (fuzzer, typed_composed_accumulation_fsdp1)."""
    return jax.tree.map(lambda x: jnp.swapaxes(split(x, 0, (-1, k)), 0, 1), batch)


def accumulate(grad_fn: Callable, params, batch, loss_fn):
    """`grad_fn(params, batch)` -- ((loss, metrics), grads) -- summed in float32 over the
    K = loss_fn.steps microbatches of `batch`, each microbatch's loss scaled by 1/K (SHARE;
    exact for K a power of two), so the sum is the step's mean. The batch's 'weight', when
    it has one, is normalised over the whole step (datasets/batches.py), so the mean of the
    K microbatch means is the token-weighted mean of the step, never a mean of per-microbatch
    means. The first microbatch is outside the loop: the accumulator starts as its gradient,
    with its type (in typed/ `unreduced`, each device's partial sum; an unreduced array can
    be added to but not divided), and the reduction the twin writes after this call runs
    once per step. K = 1 is `grad_fn(params, batch)` itself: the same program as without."""
    k = getattr(loss_fn, 'steps', 1)
    if k == 1:
        return grad_fn(params, batch)
    parts = microbatches(batch, k)
    part = lambda i: {**jax.tree.map(lambda x: x[i], parts), SHARE: 1.0 / k}
    first = jax.tree.map(lambda x: x.astype(jnp.float32), grad_fn(params, part(0)))

    def add(i, total):  # the float32 accumulator, whatever the compute dtype
        return jax.tree.map(lambda t, x: t + x.astype(jnp.float32), total, grad_fn(params, part(i)))

    return jax.lax.fori_loop(1, k, add, first)


def check_accumulation(plan, batch_size: int, k: int) -> None:
    """--gradient_accumulation_steps=K against the plan: K must divide each row device's rows
    (its microbatches are equal parts of them), and a 'stage' axis refuses K > 1."""
    if k == 1:
        return
    if plan.uses(STAGE):
        raise UsageError(
            f'--gradient_accumulation_steps={k} with a pipeline (the mesh\'s stage axis): its '
            'step already cuts the batch into --microbatches=M and sums their gradients; K '
            f'windows of M would be the gradient of --microbatches={k} x M: raise that instead '
            '(--pp_schedule=1f1b keeps activation memory bounded by the stages, not by M)'
        )
    rows = batch_size // math.prod(plan.size(a) for a in plan.rows)
    if rows % k:
        raise UsageError(
            f'--gradient_accumulation_steps={k} does not divide the {rows} rows each device of '
            f"the mesh's row axes takes (--batch_size={batch_size}): use a K that divides "
            f'{rows}, or a --batch_size whose per-device share K divides'
        )


# --- The one-device run: no mesh, no sharding, no collective. ---


def one_device_loss_and_grads(graphdef, loss_fn) -> Callable:
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    @jax.jit
    def loss_and_grads(params, batch):
        (_, metrics), grads = grad_fn(params, batch)
        return metrics, grads

    return loss_and_grads


def one_device_train_step(graphdef, loss_fn, tx) -> Callable:
    loss_and_grads = one_device_loss_and_grads(graphdef, loss_fn)

    def train_step(state: TrainState, batch: dict[str, Any]):
        metrics, grads = loss_and_grads(state.params, batch)
        state = apply_gradients(state, grads, tx)
        return state, with_grad_norm(metrics, state.opt_state)

    # The state is donated, as the twins donate theirs: the new state may reuse its buffers (on
    # a GPU, not donating made this step markedly slower than the twins': docs/benchmarks.md).
    return jax.jit(train_step, donate_argnums=0)
