"""Bit rot in checkpoints: the SHA-256 of every file of a complete checkpoint, written once the
save is complete and verified before every read (shard_parity/runtime/checkpoint.py calls both).

    <workdir>/checkpoints/<step>/checksums.sha256   in `sha256sum` format:
    cd <workdir>/checkpoints/<step> && sha256sum -c checksums.sha256

Orbax and TensorStore catch a truncated file but read flipped bytes without complaint, so a
damaged checkpoint resumed silently with other parameters.
"""

import hashlib
import pathlib

from absl import logging


class Damaged(Exception):
    """A file of a checkpoint differs from the checksum written when it was saved."""


CHECKSUMS = 'checksums.sha256'  # in each step's folder, in `sha256sum` format


def _digests(folder: pathlib.Path) -> dict[str, str]:
    """relative path -> SHA-256 of every file under `folder` but the checksums themselves."""
    out = {}
    for f in sorted(folder.rglob('*')):
        if f.is_file() and f.name != CHECKSUMS:
            with open(f, 'rb') as fh:
                digest = hashlib.file_digest(fh, 'sha256').hexdigest()
            out[f.relative_to(folder).as_posix()] = digest
    return out


def write_checksums(folder: pathlib.Path) -> None:
    """Writes the SHA-256 of each file of a complete checkpoint (once), so that bit rot is
    refused at restore; `cd <step> && sha256sum -c checksums.sha256` checks it by hand."""
    path = folder / CHECKSUMS
    if path.exists():
        return
    text = ''.join(f'{digest}  {name}\n' for name, digest in _digests(folder).items())
    tmp = path.with_suffix('.tmp')
    tmp.write_text(text)
    tmp.replace(path)


_VERIFIED = {}  # folder -> the checksum file's mtime when it was last found intact


def verify(folder: pathlib.Path) -> str | None:
    """None if every file of checkpoint `folder` has the checksum written at save, else what
    differs. A folder without checksums (saved before they existed, or killed before they were
    written) is read unverified, with a warning."""
    path = folder / CHECKSUMS
    if not path.is_file():
        if folder.is_dir() and folder not in _VERIFIED:
            logging.warning('%s has no %s: it is read unverified', folder, CHECKSUMS)
            _VERIFIED[folder] = None
        return None
    if _VERIFIED.get(folder) == path.stat().st_mtime_ns:
        return None
    expected = dict(line.split('  ', 1)[::-1] for line in path.read_text().splitlines())
    found = _digests(folder)
    for name, digest in expected.items():
        if name not in found:
            return f'{name} is missing'
        if found[name] != digest:
            return f'{name} does not match the checksum written when it was saved'
    _VERIFIED[folder] = path.stat().st_mtime_ns
    return None
