"""What a run writes to its workdir: the lock, metrics.jsonl, the confusion matrix and some wrong
predictions.

Each file is written to a temporary name and renamed into place (mode 0644), so an interrupted
run never leaves a half-written report where a good one stood. metrics.jsonl is appended one
whole line at a time; a line a full disk cut short is taken back, and on resume any torn or
unparsable line is dropped with one warning.
"""

import contextlib
import fcntl
import json
import os
import pathlib
import socket
import tempfile
import time

import numpy as np
from absl import logging

from shard_parity import UsageError


def atomic_write(path: pathlib.Path, write) -> None:
    """Calls write(f) on a temp file beside `path`, then renames it over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.')
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide reports from the rest of the team
        with os.fdopen(fd, 'wb') as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


WRITTEN = ('metrics.jsonl', 'config.json')  # the files a run rewrites in its workdir


def ensure_writable(workdir: pathlib.Path) -> None:
    """Fails early, with the path in the message, rather than after the first hour of training:
    a --workdir that cannot be written is a bad input (exit 2). A symbolic link to nowhere
    names where it points; a folder where a run's file belongs is named too (renaming over it
    failed with a raw [Errno 21] naming a temporary file)."""
    if workdir.is_symlink() and not workdir.exists():
        raise UsageError(
            f'--workdir={workdir} is a symbolic link to {os.readlink(workdir)}, which does not '
            'exist: create that folder, or give another --workdir'
        )
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=workdir).close()
    except OSError as e:
        raise UsageError(f'--workdir={workdir} is not writable ({e.strerror})') from e
    for name in WRITTEN:
        if (workdir / name).is_dir():
            raise UsageError(
                f'{workdir / name} is a folder, not a file: the run writes its {name} there; '
                'move the folder aside'
            )


@contextlib.contextmanager
def hold_workdir(workdir: pathlib.Path, enabled: bool = True):
    """One trainer per workdir: an OS lock (flock) on the workdir folder itself for the run's
    lifetime, which no one can delete from under the holder as they could a lock file. The kernel
    releases it when the process ends, however it ends, so a kill -9 leaves nothing stale;
    <workdir>/.lock only names the holder for whoever is refused."""
    if not enabled:  # with several processes, process 0 holds it for all
        yield
        return
    fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f'--workdir={workdir} is in use by another trainer ({holder(workdir)}): wait for '
                'it to end, or use another --workdir'
            ) from None
        name_holder(workdir)
        yield
    finally:
        os.close(fd)


def holder(workdir: pathlib.Path) -> str:
    try:
        return (workdir / '.lock').read_bytes()[:300].decode(errors='replace').strip()
    except OSError:
        return 'another process'


def name_holder(workdir: pathlib.Path) -> None:
    """Writes who holds the lock into <workdir>/.lock; if the disk cannot take it, says where
    and leaves no .lock behind."""
    path, since = workdir / '.lock', time.strftime('%Y-%m-%d %H:%M:%S')
    try:
        with open(path, 'w') as f:
            f.write(f'pid {os.getpid()} on {socket.gethostname()} since {since}\n')
    except OSError as e:
        path.unlink(missing_ok=True)
        raise OSError(f'cannot write {path} ({e.strerror})') from e


class MetricsLog:
    """<workdir>/metrics.jsonl: one JSON object per line, each with 'step'."""

    def __init__(self, path: pathlib.Path, resume_from: int = 0, enabled: bool = True):
        """A new run starts a new log; a run resumed at step s keeps the good lines up to s (not
        the final one) and drops what a killed run logged after its last checkpoint. A missing,
        torn or garbled log never blocks the resume: one warning says what was lost."""
        self.path, self.enabled = path, enabled
        if not enabled:  # another process than 0: it writes nothing
            return
        keep = read_history(path, resume_from) if resume_from else []
        atomic_write(path, lambda f: f.write(''.join(keep).encode()))

    def write(self, **record) -> None:
        """Appends one whole line; if the disk cannot take all of it, none of it stays."""
        if not self.enabled:
            return
        line = (json.dumps(record) + '\n').encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        try:
            while line:
                line = line[os.write(fd, line) :]
        except OSError as e:
            os.ftruncate(fd, size)
            raise UsageError(
                f'could not write {self.path} ({e.strerror}); its earlier lines are intact'
            ) from e
        finally:
            os.close(fd)


def read_history(path: pathlib.Path, resume_from: int) -> list[str]:
    """The lines of `path` a run resumed at step `resume_from` keeps, warning once if some
    could not be read or the file is gone."""
    if not path.exists():
        logging.warning(
            '%s is missing: resuming at step %d without the history before it', path, resume_from
        )
        return []
    keep, bad = [], 0
    for line in path.read_bytes().splitlines():
        try:
            record = json.loads(line)
            step = record['step']
            if not isinstance(step, int) or isinstance(step, bool):  # 1e400 is inf, 1.5 no step
                raise TypeError(step)
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if step <= resume_from and not record.get('final'):
            keep.append(line.decode() + '\n')
    if bad:
        logging.warning(
            '%s: dropped %d torn or unparsable line(s); kept %d good ones up to step %d',
            path,
            bad,
            len(keep),
            resume_from,
        )
    return keep


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
    table = '\n'.join(lines) + '\n'
    atomic_write(workdir / 'confusion_matrix.txt', lambda f: f.write(table.encode()))
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
