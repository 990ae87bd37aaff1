"""The batches: pure functions of (seed, step), so both twins, every device count, every process
count and a resumed run all see the same data.

    python -m pytest parity_tests/test_batches.py -q
"""

import numpy as np
import pytest

from shard_parity.datasets import batches


def classification(n=103, seed=0, batch_size=10):
    ids = np.arange(n)
    return batches.ClassificationBatches(np.repeat(ids[:, None], 784, 1), ids, batch_size, seed)


def test_classification_batches_are_pure_functions_of_seed_and_step():
    a, b = classification(), classification()
    assert not np.array_equal(a.batch(0)['label'], a.batch(1)['label'])
    assert not np.array_equal(a.batch(0)['label'], classification(seed=1).batch(0)['label'])
    for step in [25, 3, 0, 10, 9, 3]:  # out of order, across the 10-step epoch boundary
        np.testing.assert_array_equal(a.batch(step)['label'], b.batch(step)['label'])
    batch = a.batch(0)
    assert batch['image'].shape == (10, 784) and batch['image'].dtype == np.float32
    assert batch['label'].dtype == np.int32
    np.testing.assert_array_equal(batch['image'][:, 0], batch['label'])  # images follow labels


def test_each_epoch_covers_each_example_once():
    a = classification()  # 103 examples, 10 per batch: 10 steps per epoch, 3 dropped
    epochs = [np.concatenate([a.batch(e * 10 + i)['label'] for i in range(10)]) for e in range(3)]
    for seen in epochs:
        assert len(seen) == 100 and len(np.unique(seen)) == 100
    assert not np.array_equal(epochs[0], epochs[1])  # each epoch reshuffles
    full = classification(n=100)
    seen = np.concatenate([full.batch(10 + i)['label'] for i in range(10)])
    np.testing.assert_array_equal(np.sort(seen), np.arange(100))


@pytest.mark.parametrize('batch_size', [0, -1, 104])
def test_classification_batch_size_is_checked(batch_size):
    with pytest.raises(ValueError, match='batch_size'):
        classification(batch_size=batch_size)


def test_language_model_batches():
    tokens = np.arange(200, dtype=np.uint8)  # each token's value is its position
    a = batches.LanguageModelBatches(tokens, batch_size=8, seq_len=16, seed=0)
    b = batches.LanguageModelBatches(tokens, batch_size=8, seq_len=16, seed=0)
    assert not np.array_equal(a.batch(0)['x'], a.batch(1)['x'])
    np.testing.assert_array_equal(a.batch(5)['x'], b.batch(5)['x'])
    batch = a.batch(5)
    assert batch['x'].shape == (8, 16) and batch['x'].dtype == np.int32
    np.testing.assert_array_equal(batch['y'], batch['x'] + 1)
    np.testing.assert_array_equal(batch['x'][:, 1:], batch['x'][:, :-1] + 1)  # contiguous windows
    tight = batches.LanguageModelBatches(tokens[:17], batch_size=4, seq_len=16, seed=0)
    np.testing.assert_array_equal(tight.batch(3)['y'][0], np.arange(1, 17))  # reaches the end
    with pytest.raises(ValueError, match='need at least seq_len \\+ 1 = 17'):
        batches.LanguageModelBatches(tokens[:16], batch_size=4, seq_len=16, seed=0)


def test_eval_batches_cover_each_example_once():
    ids = np.arange(23)
    evals = batches.eval_batches_classification(np.repeat(ids[:, None], 784, 1), ids, 10)
    assert len(evals) == 3 and all(b['image'].shape == (10, 784) for b in evals)
    mask = np.concatenate([b['mask'] for b in evals])
    labels = np.concatenate([b['label'] for b in evals])
    np.testing.assert_array_equal(mask, [1] * 23 + [0] * 7)
    np.testing.assert_array_equal(labels[mask == 1], ids)


def test_eval_batches_lm_are_fixed():
    tokens = np.random.default_rng(0).integers(0, 256, 500).astype(np.uint8)
    first = batches.eval_batches_lm(tokens, 4, 32, num_batches=3)
    again = batches.eval_batches_lm(tokens, 4, 32, num_batches=3)
    assert len(first) == 3 and not np.array_equal(first[0]['x'], first[1]['x'])
    for one, two in zip(first, again):
        np.testing.assert_array_equal(one['x'], two['x'])
        np.testing.assert_array_equal(one['y'][:, :-1], one['x'][:, 1:])


def test_a_process_draws_exactly_its_rows_of_the_global_batch():
    tokens = np.arange(1000, dtype=np.uint8)
    lm = batches.LanguageModelBatches(tokens, 8, 16, seed=0)
    cls = classification(batch_size=10)
    for source in (lm, cls):
        whole = source.batch(3)
        parts = [
            source.batch(3, rows=slice(i, i + 2 if source is lm else i + 5))
            for i in ((0, 2, 4, 6) if source is lm else (0, 5))
        ]
        for key in whole:
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])
        assert not np.array_equal(source.batch(4)[key], whole[key])


def test_with_k_an_epochs_remainder_ends_it_on_a_partial_window():
    """108 examples, batch 10, K=2 (microbatches of 5): 10 whole steps, then the 8 left hold one
    whole microbatch, so step 10 is a partial window: its microbatch 0 (rows 0, 2, .., 8) holds 5
    examples not seen in the epoch, weighing 10/5 each (the step's mean is over its 5 rows, not
    over K x 5), microbatch 1 weighs zero. K=1 and a remainder under one microbatch drop it."""
    ids = np.arange(108)
    data = np.repeat(ids[:, None], 784, 1), ids
    assert batches.ClassificationBatches(*data, 10, 0).steps_per_epoch == 10
    assert batches.ClassificationBatches(*data, 10, 0, microbatches=4).steps_per_epoch == 10
    a = batches.ClassificationBatches(*data, 10, 0, microbatches=2)
    assert a.steps_per_epoch == 11
    full, last = a.batch(3), a.batch(10)
    np.testing.assert_array_equal(full['weight'], np.ones(10))  # one program: weights of 1
    np.testing.assert_array_equal(last['weight'], np.tile([2.0, 0.0], 5))
    seen = np.concatenate([a.batch(i)['label'] for i in range(10)] + [last['label'][::2]])
    assert len(np.unique(seen)) == 105  # each example at most once: 3 of 108 dropped
    for step in (3, 10):  # a process's rows are its part of the same global batch
        whole = a.batch(step)
        parts = [a.batch(step, slice(r, r + 5)) for r in (0, 5)]
        for name in whole:
            np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), whole[name])
    assert a.batch(11)['weight'].sum() == 10 and a.batch(21)['weight'][1] == 0  # epoch 2 likewise
