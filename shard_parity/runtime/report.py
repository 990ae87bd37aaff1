"""What a run writes to its workdir: metrics.jsonl, the confusion matrix and some wrong predictions.

Each file is written to a temporary name and renamed into place, so an interrupted run never
leaves a half-written report where a good one stood. metrics.jsonl is appended line by line
(a reader sees whole lines only).
"""

import json
import os
import pathlib
import tempfile

import numpy as np


def atomic_write(path: pathlib.Path, write) -> None:
    """Calls write(f) on a temp file beside `path`, then renames it over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.')
    try:
        with os.fdopen(fd, 'wb') as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def ensure_writable(workdir: pathlib.Path) -> None:
    """Fails early, with the path in the message, rather than after the first hour of training."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=workdir).close()
    except OSError as e:
        raise OSError(f'--workdir={workdir} is not writable ({e.strerror})') from e


class MetricsLog:
    """<workdir>/metrics.jsonl: one JSON object per line, each with 'step'."""

    def __init__(self, path: pathlib.Path, resume_from: int = 0, enabled: bool = True):
        """A new run starts a new log; a run resumed at step s keeps the lines up to s (not the
        final one) and drops what a killed run logged after its last checkpoint."""
        self.path, self.enabled = path, enabled
        if not enabled:  # another process than 0: it writes nothing
            return
        keep = []
        if resume_from and path.exists():
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record['step'] <= resume_from and not record.get('final'):
                    keep.append(line + '\n')
        atomic_write(path, lambda f: f.write(''.join(keep).encode()))

    def write(self, **record) -> None:
        if not self.enabled:
            return
        with self.path.open('a') as f:
            f.write(json.dumps(record) + '\n')


def confusion_matrix(labels, preds, num_classes: int = 10) -> np.ndarray:
    cm = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(cm, (labels, preds), 1)
    return cm  # rows: true label, columns: predicted


def write_classification_report(workdir: pathlib.Path, images, labels, preds, few: int = 16):
    cm = confusion_matrix(labels, preds)
    header = 'rows: true digit, columns: predicted digit\n     ' + ''.join(
        f'{c:>6}' for c in range(10)
    )
    lines = [header] + [f'{r:>5}' + ''.join(f'{v:>6}' for v in row) for r, row in enumerate(cm)]
    atomic_write(workdir / 'confusion_matrix.txt', lambda f: f.write('\n'.join(lines).encode()))
    wrong = np.flatnonzero(labels != preds)[:few]
    text = 'test_index label predicted\n' + ''.join(
        f'{i:>10} {labels[i]:>5} {preds[i]:>9}\n' for i in wrong
    )
    atomic_write(workdir / 'wrong_predictions.txt', lambda f: f.write(text.encode()))
    _plot(workdir, cm, images[wrong], labels[wrong], preds[wrong])


def _plot(workdir, cm, images, labels, preds):
    try:
        import matplotlib

        matplotlib.use('Agg')
        from matplotlib import pyplot as plt
    except ImportError:
        return  # plots are optional: pip install shard-parity[plots]
    fig, ax = plt.subplots(figsize=(6, 5))
    ax.imshow(np.log1p(cm), cmap='Blues')
    for (r, c), v in np.ndenumerate(cm):
        ax.text(c, r, str(v), ha='center', va='center', fontsize=7)
    ax.set(
        xlabel='predicted',
        ylabel='true',
        xticks=range(10),
        yticks=range(10),
        title='MNIST test confusion matrix',
    )
    atomic_write(workdir / 'confusion_matrix.png', lambda f: fig.savefig(f, format='png', dpi=100))
    plt.close(fig)
    if len(images):
        fig, axes = plt.subplots(1, len(images), figsize=(1.2 * len(images), 1.6), squeeze=False)
        for ax, img, y, p in zip(axes[0], images, labels, preds):
            ax.imshow(img.reshape(28, 28), cmap='gray')
            ax.set_title(f'{y}→{p}', fontsize=8)
            ax.axis('off')
        atomic_write(
            workdir / 'wrong_predictions.png', lambda f: fig.savefig(f, format='png', dpi=100)
        )
        plt.close(fig)
