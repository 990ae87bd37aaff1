"""Checksum-verified downloads that never leave a partial file behind.

`fetch` streams into a temporary file beside the destination, checks the size the server announced
and the checksum, and only then renames it into place (`os.replace` is atomic within a folder),
so an interrupted or corrupt download can never be mistaken for the real file on the next run.
`ensure` is what loaders call: use the local file if present, else fetch it or say where to put it.
"""

import hashlib
import http.client
import os
import pathlib
import tempfile
import urllib.error
import urllib.request

from .root import DataError

_CHUNK = 1 << 20
_WHERE = (
    'Put the official file there, or point --data_dir / SHARD_PARITY_DATA_DIR at a folder '
    'holding mnist/ and tinyshakespeare/.'
)


def fetch(
    url: str,
    dest: pathlib.Path,
    *,
    md5: str | None = None,
    sha256: str | None = None,
    timeout: float = 30,
) -> pathlib.Path:
    """Download `url` to `dest`, verifying size and checksums; raise DataError on any failure."""
    dest = pathlib.Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + '.part-')
    try:
        with os.fdopen(fd, 'wb') as f:
            hashes = _download(url, f, timeout)
        for name, expected in (('md5', md5), ('sha256', sha256)):
            if expected and hashes[name].hexdigest() != expected.lower():
                raise DataError(
                    f'{name} mismatch for {url}: expected {expected}, got '
                    f'{hashes[name].hexdigest()}; the mirror may serve another file.'
                )
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a data cache should be readable like any file
        os.replace(tmp, dest)
    finally:
        pathlib.Path(tmp).unlink(missing_ok=True)  # gone if renamed; else the partial download
    return dest


def _download(url: str, f, timeout: float) -> dict:
    """Copy the body of `url` into `f`; return its md5 and sha256 hashers."""
    hashes = {'md5': hashlib.md5(), 'sha256': hashlib.sha256()}
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            announced = response.headers.get('Content-Length')
            while chunk := response.read(_CHUNK):
                f.write(chunk)
                size += len(chunk)
                for h in hashes.values():
                    h.update(chunk)
    except urllib.error.HTTPError as e:
        raise DataError(
            f'could not download {url}: the server answered HTTP {e.code} {e.reason}.'
        ) from e
    except (OSError, http.client.HTTPException) as e:  # URLError: refused, timeout, reset, ...
        raise DataError(f'could not download {url}: offline or host unreachable ({e}).') from e
    # http.client returns a short body silently when the connection drops, so count the bytes.
    if announced is not None and size != int(announced):
        raise DataError(f'truncated download from {url}: expected {announced} bytes, got {size}.')
    return hashes


def ensure(
    dest: pathlib.Path,
    url: str,
    *,
    md5: str | None = None,
    sha256: str | None = None,
    download: bool = True,
    what: str = 'data',
) -> pathlib.Path:
    """Return `dest` if it exists (unverified), else download it if allowed; DataError otherwise."""
    dest = pathlib.Path(dest)
    if dest.is_dir():  # a folder where the file belongs: reading it was a bare [Errno 21]
        raise DataError(
            f'{what} file {dest} is a folder, not a file: move it aside'
            + (' (the file is then downloaded)' if download else '')
            + ', or put the official file there.'
        )
    if dest.exists():
        return dest
    if not download:
        raise DataError(f'{what} file {dest} is missing and downloading is off. {_WHERE}')
    try:
        return fetch(url, dest, md5=md5, sha256=sha256)
    except DataError as e:
        raise DataError(
            f'{what} file {dest} is missing and could not be downloaded: {e} {_WHERE}'
        ) from e
