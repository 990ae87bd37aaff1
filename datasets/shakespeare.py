"""Tiny Shakespeare as byte tokens (vocab 256), split 90/10 exactly as nanoGPT does.

    train, val = shakespeare.load(data_root())  # u8[1003854], u8[111540] for the real file

A file already at `<root>/tinyshakespeare/input.txt` is used as it is; a downloaded one is checked
against the sha256 below.
"""

import pathlib

import numpy as np

from .download import ensure
from .root import DataError

MIRROR = 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/'
FILE = 'input.txt'
SHA256 = '86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed'  # tests swap in theirs


def load(
    root: pathlib.Path, *, download: bool = True, base_url: str = MIRROR
) -> tuple[np.ndarray, np.ndarray]:
    """(train u8[N], val u8[M]): the first 90% of the bytes and the last 10%."""
    path = ensure(
        pathlib.Path(root) / 'tinyshakespeare' / FILE,
        base_url.rstrip('/') + '/' + FILE,
        sha256=SHA256,
        download=download,
        what='Tiny Shakespeare',
    )
    data = np.fromfile(path, dtype=np.uint8)
    n = len(data)
    train, val = data[: int(n * 0.9)], data[int(n * 0.9) :]  # nanoGPT's split, byte for byte
    if len(train) == 0 or len(val) == 0:
        raise DataError(
            f'{path} holds {n} bytes, too few to split into train and validation; '
            'replace it with the tiny Shakespeare input.txt.'
        )
    return train, val
