"""Training and evaluation batches in pure numpy, each a pure function of (seed, step).

Both twins (auto/ and explicit/) draw from these, so they see the same global batch at every step;
a run resumed from a checkpoint at step s continues with exactly the batches it would have seen.

    train = ClassificationBatches(x, y, batch_size=128, seed=0)
    batch = train.batch(step)  # {'image': f32[B, 784], 'label': i32[B]}
"""

import operator

import numpy as np


def _check_int(name: str, value, minimum: int = 1) -> None:
    """Accept anything integer-like (int, np.int64, a scalar int array) that is >= minimum."""
    try:
        ok = operator.index(value) >= minimum
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f'{name} must be an integer >= {minimum}, got {value!r}')


class ClassificationBatches:
    """Shuffled epochs without replacement; the remainder of each epoch is dropped, except, with
    `microbatches` K > 1, the whole microbatches of batch_size / K rows it still holds: they
    make the epoch's last step a partial window (`partial_window`: the missing microbatches
    weigh zero, the step counts by its rows, not by K). Every batch then carries 'weight', so
    that one program takes both (weights of 1 leave the mean as it was, to the bit)."""

    def __init__(
        self, images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int, microbatches=1
    ):
        n = len(images)
        _check_int('batch_size', batch_size)
        _check_int('seed', seed, 0)  # default_rng takes non-negative seeds only
        _check_int('microbatches', microbatches)
        if len(labels) != n:
            raise ValueError(f'{n} images but {len(labels)} labels')
        if batch_size > n:
            raise ValueError(f'batch_size {batch_size} exceeds the {n} examples in the set')
        self.images, self.labels = images, labels
        self.batch_size, self.seed, self.k = batch_size, seed, microbatches
        self.full = n // batch_size  # whole steps per epoch
        divides = microbatches > 1 and batch_size % microbatches == 0
        self.present = (n % batch_size) // (batch_size // microbatches) if divides else 0
        self.steps_per_epoch = self.full + (self.present > 0)
        self._epoch, self._perm = -1, None

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of examples in `epoch`; the current one is cached since steps go in order."""
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.images))
            self._epoch = epoch
        return self._perm

    def batch(self, step: int, rows: slice = slice(None)) -> dict:
        """The global batch of `step`, or only its `rows` (a process's part of it)."""
        _check_int('step', step, 0)
        epoch, i = divmod(step, self.steps_per_epoch)
        b, order = self.batch_size, self.permutation(epoch)
        if i < self.full:
            out = self._examples(order[i * b : (i + 1) * b][rows])
            return {**out, 'weight': np.ones(len(out['label']), np.float32)} if self.present else out
        # the partial window: row r is in microbatch r % K; the first `present` hold the rest
        held = np.flatnonzero(np.arange(b) % self.k < self.present)
        idx = np.zeros(b, np.int64)  # the missing microbatches: example 0, weighing zero
        idx[held] = order[self.full * b : self.full * b + len(held)]
        window = partial_window(self._examples(idx), self.k, self.present)
        return {name: v[rows] for name, v in window.items()}

    def _examples(self, idx: np.ndarray) -> dict:
        return dict(
            image=np.asarray(self.images[idx], np.float32),
            label=np.asarray(self.labels[idx], np.int32),
        )


def loss_weights(mask: np.ndarray) -> np.ndarray:
    """A step's loss mask (1 a token or row that counts, 0 padding) as the weights the losses
    take (shard_parity/runtime/tasks.py): mask x size / count, so that the plain mean of
    weight x loss over the step is the sum over real tokens divided by their count, the same
    mean whether it is taken at once or as the mean of K equal microbatches' means."""
    count = mask.sum()
    if count == 0:
        raise ValueError('a step whose loss mask is all zero has no tokens to average over')
    return (mask * (mask.size / count)).astype(np.float32)


def partial_window(batch: dict, k: int, present: int) -> dict:
    """`batch` as the last window of a dataset that does not divide into K microbatches: only
    the first `present` of its K microbatches hold data (row r is in microbatch r % K, as
    shard_parity/step.py splits), the rest weigh zero, and the weights are normalised over
    the tokens present: the window counts by its tokens, not by K."""
    if not 1 <= present <= k:
        raise ValueError(f'present={present} microbatches: allowed 1 to K={k}')
    target = batch['y'] if 'y' in batch else batch['label']  # the loss's shape: [B, T] or [B]
    mask = batch['weight'] > 0 if 'weight' in batch else np.ones(target.shape, np.float32)
    rows = (np.arange(len(target)) % k < present).reshape(-1, *[1] * (mask.ndim - 1))
    return {**batch, 'weight': loss_weights(mask * rows)}


class LanguageModelBatches:
    """nanoGPT's get_batch: B random windows of T tokens, targets shifted by one. With
    `documents`, each window is a document of random length (1 to T tokens) then padding
    (byte 0), and the batch carries the loss weights of its mask ('weight', f32[B, T])."""

    def __init__(
        self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, documents=False
    ):
        _check_int('batch_size', batch_size)
        _check_int('seq_len', seq_len)
        _check_int('seed', seed, 0)
        if len(tokens) < seq_len + 1:  # y reads one token past x
            raise ValueError(
                f'{len(tokens)} tokens are too few for seq_len {seq_len}; '
                f'need at least seq_len + 1 = {seq_len + 1}'
            )
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed
        self.documents = documents

    def batch(self, step: int, rows: slice = slice(None)) -> dict:
        """The global batch of `step`, or only its `rows` (a process's part of it)."""
        _check_int('step', step, 0)
        n, t = len(self.tokens), self.seq_len
        rng = np.random.default_rng([self.seed, step])
        ix = rng.integers(0, n - t, size=self.batch_size)
        window = ix[rows, None] + np.arange(t)  # (B, T); the largest index is n - t - 1 + t = n - 1
        out = dict(
            x=self.tokens[window].astype(np.int32), y=self.tokens[window + 1].astype(np.int32)
        )
        if not self.documents:
            return out
        lengths = rng.integers(1, t + 1, size=self.batch_size)  # drawn after ix: ix unchanged
        mask = (np.arange(t) < lengths[:, None]).astype(np.float32)  # the whole batch's
        out = {name: np.where(mask[rows] > 0, v, 0).astype(np.int32) for name, v in out.items()}
        return {**out, 'weight': loss_weights(mask)[rows]}  # normalised over the whole batch


def eval_batches_classification(
    images: np.ndarray, labels: np.ndarray, batch_size: int
) -> list[dict]:
    """The whole set in order; the last batch is zero-padded and `mask` marks the real examples."""
    _check_int('batch_size', batch_size)
    _check_int('number of examples', len(images))
    if len(labels) != len(images):
        raise ValueError(f'{len(images)} images but {len(labels)} labels')
    out = []
    for start in range(0, len(images), batch_size):
        k = min(batch_size, len(images) - start)  # real examples in this batch
        image = np.zeros((batch_size, *images.shape[1:]), np.float32)
        label = np.zeros(batch_size, np.int32)
        mask = np.zeros(batch_size, np.float32)
        image[:k], label[:k], mask[:k] = images[start : start + k], labels[start : start + k], 1
        out.append(dict(image=image, label=label, mask=mask))
    return out


def eval_batches_lm(
    tokens: np.ndarray, batch_size: int, seq_len: int, num_batches: int, seed: int = 0
) -> list[dict]:
    """A fixed set of `num_batches` random windows: the same for every call with these arguments."""
    _check_int('num_batches', num_batches)
    batches = LanguageModelBatches(tokens, batch_size, seq_len, seed)
    return [batches.batch(step) for step in range(num_batches)]
