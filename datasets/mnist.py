"""MNIST from the four official IDX gzip files, as standardised float32 vectors.

    splits = mnist.load(data_root())  # {'train': (x f32[N, 784], y i32[N]), 'test': (...)}

Files already in `<root>/mnist/` are used as they are (the shared stand-in has its own checksums);
only files this loader downloads are checked against the official md5s.
"""

import gzip
import math
import pathlib
import struct
import zlib

import numpy as np

from .download import ensure
from .root import DataError

MIRROR = 'https://ossci-datasets.s3.amazonaws.com/mnist/'
MD5 = {  # official, as published by torchvision; tests swap in their own
    'train-images-idx3-ubyte.gz': 'f68b3c2dcbeaaa9fbdd348bbdeb94873',
    'train-labels-idx1-ubyte.gz': 'd53e105ee54ea40749a09fcbcd1e9432',
    't10k-images-idx3-ubyte.gz': '9fb629c4189551a2d022fa330f9573f3',
    't10k-labels-idx1-ubyte.gz': 'ec29112dd5afa0611ce80d1b7f02629c',
}
SPLITS = {
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
    'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801  # unsigned bytes; 3 dims / 1 dim
MEAN, STD = 0.1307, 0.3081  # of the official training pixels in [0, 1]


def load(root: pathlib.Path, *, download: bool = True, base_url: str = MIRROR) -> dict:
    """Both splits as {'train': (images f32[N, 784], labels i32[N]), 'test': (...)}."""
    folder = pathlib.Path(root) / 'mnist'
    out = {}
    for split, (images_name, labels_name) in SPLITS.items():
        images_path, labels_path = (
            ensure(
                folder / name,
                base_url.rstrip('/') + '/' + name,
                md5=MD5[name],
                download=download,
                what='MNIST',
            )
            for name in (images_name, labels_name)
        )
        images = read_idx(images_path, IMAGES_MAGIC)  # u8[N, 28, 28]
        labels = read_idx(labels_path, LABELS_MAGIC)  # u8[N]
        if images.shape[1:] != (28, 28):
            raise DataError(
                f'{images_path} holds images of shape {images.shape[1:]}, expected '
                '(28, 28); replace it with the official file.'
            )
        if len(images) == 0:  # a data fault, not a --batch_size too large for the split
            raise DataError(
                f'{images_path} holds 0 images; replace it with the official file.'
            )
        if len(images) != len(labels):
            raise DataError(
                f'{images_path} holds {len(images)} images but {labels_path} holds '
                f'{len(labels)} labels; replace both with the official files.'
            )
        if labels.max(initial=0) > 9:
            raise DataError(
                f'{labels_path} holds label {labels.max()}, expected 0..9; '
                'replace it with the official file.'
            )
        x = (images.reshape(len(images), 784).astype(np.float32) / 255 - MEAN) / STD
        out[split] = (x.astype(np.float32), labels.astype(np.int32))
    return out


def read_idx(path: pathlib.Path, magic: int) -> np.ndarray:
    """Parse a gzipped IDX file of unsigned bytes, checking its magic number and exact size."""
    try:
        with gzip.open(path, 'rb') as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:  # not gzip, truncated, or corrupt
        raise DataError(
            f'{path} is not a readable gzip file ({e}); delete it to download it '
            'again, or replace it with the official file.'
        ) from e
    if len(raw) < 4:  # an empty file (0 bytes) decompresses to nothing: no magic number at all
        raise DataError(
            f'{path} is {path.stat().st_size} bytes and decompresses to {len(raw)}, too few for '
            "an IDX header: it is empty or cut short; delete it to download it again, or replace "
            'it with the official file.'
        )
    got_magic = int.from_bytes(raw[:4], 'big')
    if got_magic != magic:
        raise DataError(
            f'{path} has IDX magic number {got_magic:#010x}, expected {magic:#010x}; '
            'replace it with the official file.'
        )
    ndim = magic & 0xFF  # the magic's last byte counts the dims
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(
            f'{path} decompresses to {len(raw)} bytes, less than its {header}-byte '
            'IDX header; delete it or replace it with the official file.'
        )
    dims = struct.unpack(f'>{ndim}I', raw[4:header])
    expected = header + math.prod(dims)
    if len(raw) != expected:
        raise DataError(
            f'{path} decompresses to {len(raw)} bytes but its IDX header (dims '
            f'{dims}) calls for {expected}; delete it or replace it with the '
            'official file.'
        )
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)
