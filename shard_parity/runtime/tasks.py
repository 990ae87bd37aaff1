"""A task is what the loop needs to know about one model: its data, losses and evaluation.

The loop in shard_parity/runtime/loop.py is the same for every model and twin; it asks the task
for batches, hands its loss to the twin's train step, and lets it summarise the evaluation.
"""

import dataclasses
import pathlib
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from shard_parity import UsageError
from shard_parity.datasets import batches, mnist, shakespeare
from shard_parity.datasets.root import data_root
from shard_parity.model.mlp import MLP
from shard_parity.model.moe import AUX_WEIGHT
from shard_parity.model.ops import cross_entropy
from shard_parity.model.transformer import Transformer
from shard_parity import config as cfg
from shard_parity.runtime import report
from shard_parity.step import Accumulated


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    model_config: Any
    make_model: Callable[[nnx.Rngs], nnx.Module]
    loss_fn: Callable  # (model, batch) -> (mean loss, metrics): differentiated by the twins,
    # over --gradient_accumulation_steps microbatches (step.Accumulated)
    eval_fn: Callable  # (model, batch) -> per-example outputs
    train_batches: Any  # .batch(step) -> dict of host arrays, a pure function of (seed, step)
    eval_batches: list[dict]  # fixed; a 'mask' entry marks padding and never reaches the device
    summarize: Callable[[dict], dict]  # concatenated per-example outputs -> eval metrics
    write_report: Callable[[pathlib.Path, dict], None]
    throughput_unit: str  # 'examples' or 'tokens'
    units_per_batch: int


def weighted_mean(values, batch):
    """The loss's mean: plain, or with the batch's 'weight' (a loss mask normalised over the
    whole step: datasets/batches.py, loss_weights) the sum over real tokens (rows) divided by
    their count in the step. Without one, the program of a run with no mask is as it was."""
    return (values * batch['weight']).mean() if 'weight' in batch else values.mean()


def classification_loss(model, batch):
    logits = model(batch['image'])  # f32[B, 10]
    loss = weighted_mean(cross_entropy(logits, batch['label']), batch)
    accuracy = weighted_mean(jnp.argmax(logits, -1) == batch['label'], batch)
    return loss, {'loss': loss, 'accuracy': accuracy}


def classification_eval(model, batch):
    """Per-example outputs, so the host can mask padding and build the confusion matrix."""
    logits = model(batch['image'])
    losses = cross_entropy(logits, batch['label'])
    return {'loss': losses, 'pred': jnp.argmax(logits, -1)}


def mnist_task(config: cfg.TrainConfig, data_dir: str | None = None, download=True,
               model_config: cfg.MLPConfig = cfg.MLPConfig()) -> Task:  # fmt: skip
    if config.variable_length:
        raise UsageError('--variable_length cuts text into documents: --model=transformer only')
    data = mnist.load(data_root(data_dir), download=download)
    if config.batch_size > len(data['train'][1]):
        raise UsageError(
            f'--batch_size={config.batch_size} is larger than the MNIST training split '
            f"({len(data['train'][1]):,} examples): use at most that"
        )
    images, labels = data['test']
    eval_batches = batches.eval_batches_classification(images, labels, config.batch_size)
    keep = np.concatenate([b['mask'] for b in eval_batches]) > 0

    def summarize(out):
        return {
            'eval_loss': float(out['loss'][keep].mean()),
            'eval_accuracy': float((out['pred'][keep] == labels).mean()),
        }

    def write_report(workdir, out):
        pixels = images * mnist.STD + mnist.MEAN  # back to [0, 1] for the pictures
        report.write_classification_report(workdir, pixels, labels, out['pred'][keep])

    return Task(
        name='mlp',
        model_config=model_config,
        make_model=lambda rngs: MLP(model_config, rngs=rngs),
        loss_fn=Accumulated(classification_loss, config.gradient_accumulation_steps),
        eval_fn=classification_eval,
        train_batches=batches.ClassificationBatches(
            *data['train'], config.batch_size, config.seed, config.gradient_accumulation_steps
        ),
        eval_batches=eval_batches,
        summarize=summarize,
        write_report=write_report,
        throughput_unit='examples',
        units_per_batch=config.batch_size,
    )


def lm_loss(model, batch):
    stats = []  # with --num_experts, each MoE layer's auxiliary loss and dropped share
    logits, _ = model(batch['x'], moe_stats=stats)  # f32[B, T, 256]
    loss = weighted_mean(cross_entropy(logits, batch['y']), batch)  # over the real tokens
    if not stats:
        return loss, {'loss': loss}
    aux = jnp.mean(jnp.stack([jnp.mean(s['aux']) for s in stats]))  # the mean over layers
    dropped = jnp.mean(jnp.stack([jnp.mean(s['dropped']) for s in stats]))
    loss = loss + AUX_WEIGHT * aux  # the train loss: next-byte loss plus the balancing term
    return loss, {'loss': loss, 'moe_aux_loss': aux, 'moe_dropped': dropped}


def lm_eval(model, batch):
    """The mean next-byte loss of each sequence: f32[B]."""
    logits, _ = model(batch['x'])
    return {'loss': cross_entropy(logits, batch['y']).mean(-1)}


EVAL_BATCHES = 100  # fixed validation windows: 100 x 12 x 64 = 76,800 bytes at the defaults


def shakespeare_task(
    config: cfg.TrainConfig, model_config: cfg.TransformerConfig, data_dir=None, download=True
) -> Task:
    train, val = shakespeare.load(data_root(data_dir), download=download)
    b, t = config.batch_size, model_config.seq_len
    if t >= len(val):
        raise UsageError(
            f'--seq_len={t} is longer than the validation text ({len(val):,} '
            'bytes): windows of that length cannot be drawn; use a shorter context'
        )

    def summarize(out):
        loss = float(out['loss'].mean())
        return {'eval_loss': loss, 'eval_perplexity': float(np.exp(loss))}

    return Task(
        name='transformer',
        model_config=model_config,
        make_model=lambda rngs: Transformer(model_config, rngs=rngs),
        loss_fn=Accumulated(lm_loss, config.gradient_accumulation_steps),
        eval_fn=lm_eval,
        train_batches=batches.LanguageModelBatches(
            train, b, t, config.seed, documents=config.variable_length
        ),
        eval_batches=batches.eval_batches_lm(val, b, t, EVAL_BATCHES, seed=0),
        summarize=summarize,
        write_report=lambda workdir, out: None,
        throughput_unit='tokens',
        units_per_batch=b * t,
    )
