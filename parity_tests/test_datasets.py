"""The data layer: verified atomic downloads, strict IDX parsing, and batches as pure functions.

Offline: downloads are served by a loopback HTTP server from synthetic files in tmp_path.
The real-data test reads $SHARD_PARITY_DATA_DIR (e.g. ../shared/data) and is skipped without it.

    SHARD_PARITY_DATA_DIR=../shared/data python -m pytest parity_tests/test_datasets.py -q
"""

import gzip
import hashlib
import os
import pathlib
import re
import struct

import numpy as np
import pytest

from parity_tests._http import closed_port_url, serve
from shard_parity.datasets import download, mnist, shakespeare
from shard_parity.datasets.root import DataError, data_root


@pytest.fixture
def server(tmp_path, monkeypatch):
    """(folder, base URL) of a loopback server; files put in the folder are served."""
    for var in ('no_proxy', 'NO_PROXY'):  # a proxy from the environment must not see loopback
        monkeypatch.setenv(var, '127.0.0.1,localhost')
    (tmp_path / 'served').mkdir()
    with serve(tmp_path / 'served') as url:
        yield tmp_path / 'served', url


def write_idx(path, array, *, dims=None):
    """A gzipped IDX file of unsigned bytes; `dims` overrides the header to fake a mismatch."""
    dims = array.shape if dims is None else dims
    header = struct.pack('>I', 0x0800 | len(dims)) + struct.pack(f'>{len(dims)}I', *dims)
    with gzip.open(path, 'wb') as f:
        f.write(header + array.astype(np.uint8).tobytes())
    return path


def write_mnist(folder, n=50, seed=0):
    """The four official file names with n synthetic examples each; returns (images, labels)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    for images_name, labels_name in mnist.SPLITS.values():
        write_idx(folder / images_name, images)
        write_idx(folder / labels_name, labels)
    return images, labels


def md5(path):
    return hashlib.md5(pathlib.Path(path).read_bytes()).hexdigest()


# --- downloads ------------------------------------------------------------------------------


def test_fetch_verifies_checksums_and_leaves_only_the_file(server, tmp_path):
    served, url = server
    (served / 'a.bin').write_bytes(os.urandom(5000))
    dest = tmp_path / 'out' / 'a.bin'
    sha = hashlib.sha256((served / 'a.bin').read_bytes()).hexdigest()
    download.fetch(url + 'a.bin', dest, md5=md5(served / 'a.bin'), sha256=sha)
    assert dest.read_bytes() == (served / 'a.bin').read_bytes()
    assert os.listdir(dest.parent) == ['a.bin']  # no temp file left beside it


def test_wrong_checksum_leaves_no_file(server, tmp_path):
    served, url = server
    (served / 'a.bin').write_bytes(b'not what you asked for')
    dest = tmp_path / 'out' / 'a.bin'
    with pytest.raises(DataError, match=f'expected {"0" * 32}, got {md5(served / "a.bin")}'):
        download.fetch(url + 'a.bin', dest, md5='0' * 32)
    assert os.listdir(dest.parent) == []


def test_truncated_response_leaves_no_file(server, tmp_path):
    served, url = server
    (served / 'a.bin').write_bytes(os.urandom(100_000))
    dest = tmp_path / 'out' / 'a.bin'
    with pytest.raises(DataError, match='truncated.*expected 100000 bytes, got 50000'):
        download.fetch(url + 'truncated/a.bin', dest)  # no checksum: the size check catches it
    assert os.listdir(dest.parent) == []


def test_failed_download_keeps_existing_good_file(server, tmp_path):
    served, url = server
    (served / 'a.bin').write_bytes(b'bad bytes')
    dest = tmp_path / 'a.bin'
    dest.write_bytes(b'good bytes')
    assert md5(served / 'a.bin') != md5(dest)
    with pytest.raises(DataError):
        download.fetch(url + 'a.bin', dest, md5=md5(dest))
    assert dest.read_bytes() == b'good bytes'
    assert sorted(os.listdir(tmp_path)) == ['a.bin', 'served']


def test_mnist_download_success(server, tmp_path, monkeypatch):
    served, url = server
    images, labels = write_mnist(served)
    monkeypatch.setattr(mnist, 'MD5', {name: md5(served / name) for name in mnist.MD5})
    splits = mnist.load(tmp_path / 'root', base_url=url)
    for x, y in splits.values():
        assert x.shape == (50, 784) and x.dtype == np.float32 and y.dtype == np.int32
        np.testing.assert_array_equal(
            np.rint((x * mnist.STD + mnist.MEAN) * 255), images.reshape(50, 784)
        )
        np.testing.assert_array_equal(y, labels)
    assert sorted(os.listdir(tmp_path / 'root' / 'mnist')) == sorted(mnist.MD5)


def test_mnist_download_checks_official_md5(server, tmp_path):
    served, url = server
    write_mnist(served)  # synthetic files cannot match the official checksums
    official = mnist.MD5['train-images-idx3-ubyte.gz']
    with pytest.raises(DataError, match=f'md5 mismatch.*expected {official}'):
        mnist.load(tmp_path, base_url=url)
    assert os.listdir(tmp_path / 'mnist') == []


def test_offline_error_names_the_expected_path(tmp_path):
    url = closed_port_url()
    with pytest.raises(DataError, match='offline or host unreachable') as e:
        mnist.load(tmp_path, base_url=url)
    assert str(tmp_path / 'mnist' / 'train-images-idx3-ubyte.gz') in str(e.value)
    assert 'SHARD_PARITY_DATA_DIR' in str(e.value)
    with pytest.raises(DataError, match='offline') as e:
        shakespeare.load(tmp_path, base_url=url)
    assert str(tmp_path / 'tinyshakespeare' / 'input.txt') in str(e.value)
    with pytest.raises(DataError, match='downloading is off') as e:
        mnist.load(tmp_path, download=False)
    assert str(tmp_path / 'mnist' / 'train-images-idx3-ubyte.gz') in str(e.value)


def test_existing_files_are_used_without_network(tmp_path):
    (tmp_path / 'mnist').mkdir()
    write_mnist(tmp_path / 'mnist', n=7)
    splits = mnist.load(tmp_path, base_url=closed_port_url())  # unverified: not official md5s
    assert splits['train'][0].shape == (7, 784)


# --- parsing --------------------------------------------------------------------------------


def test_truncated_gzip_names_the_file(tmp_path):
    (tmp_path / 'mnist').mkdir()
    write_mnist(tmp_path / 'mnist')
    path = tmp_path / 'mnist' / 'train-images-idx3-ubyte.gz'
    mnist.load(tmp_path, download=False)  # loads before the damage
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataError, match=f'{re.escape(str(path))}.*not a readable gzip'):
        mnist.load(tmp_path, download=False)


def test_idx_size_mismatch_names_the_file(tmp_path):
    images = np.zeros((50, 28, 28), np.uint8)
    path = write_idx(tmp_path / 'x.gz', images, dims=(51, 28, 28))
    name = re.escape(str(path))
    with pytest.raises(
        DataError, match=f'{name} decompresses to {16 + 50 * 784} bytes.*calls for {16 + 51 * 784}'
    ):
        mnist.read_idx(path, mnist.IMAGES_MAGIC)
    with pytest.raises(DataError, match=f'{name} has IDX magic number 0x0+803, expected 0x0+801'):
        mnist.read_idx(path, mnist.LABELS_MAGIC)
    assert mnist.read_idx(write_idx(path, images), mnist.IMAGES_MAGIC).shape == (50, 28, 28)


def test_images_and_labels_counts_must_agree(tmp_path):
    (tmp_path / 'mnist').mkdir()
    write_mnist(tmp_path / 'mnist')
    write_idx(tmp_path / 'mnist' / 't10k-labels-idx1-ubyte.gz', np.zeros(49, np.uint8))
    with pytest.raises(DataError, match='50 images but .*t10k-labels.* 49 labels'):
        mnist.load(tmp_path, download=False)


def test_shakespeare_download_and_split(server, tmp_path, monkeypatch):
    served, url = server
    text = os.urandom(1000)
    (served / 'input.txt').write_bytes(text)
    monkeypatch.setattr(shakespeare, 'SHA256', hashlib.sha256(text).hexdigest())
    train, val = shakespeare.load(tmp_path, base_url=url)
    assert (len(train), len(val)) == (900, 100) and train.dtype == np.uint8
    assert train.tobytes() + val.tobytes() == text
    (tmp_path / 'tinyshakespeare' / 'input.txt').write_bytes(b'')
    with pytest.raises(DataError, match='input.txt holds 0 bytes'):
        shakespeare.load(tmp_path, download=False)


def test_real_shared_data():
    if not os.environ.get('SHARD_PARITY_DATA_DIR'):
        pytest.skip('set SHARD_PARITY_DATA_DIR (e.g. ../shared/data) to check the real data')
    root = data_root()
    splits = mnist.load(root, download=False)
    (x, y), (x_test, y_test) = splits['train'], splits['test']
    assert x.shape == (8000, 784) and x_test.shape == (2000, 784) and x.dtype == np.float32
    assert y.shape == (8000,) and y_test.shape == (2000,) and y.dtype == np.int32
    assert set(np.unique(y)) == set(range(10)) and set(np.unique(y_test)) <= set(range(10))
    assert abs(x.mean()) < 0.05 and 0.9 < x.std() < 1.1  # standardised with MNIST's mean and std
    train, val = shakespeare.load(root, download=False)
    assert (len(train), len(val)) == (1_003_854, 111_540)


def test_data_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv('SHARD_PARITY_DATA_DIR', '/env/data')
    monkeypatch.setenv('XDG_CACHE_HOME', '/xdg')
    assert data_root('/flag/data') == pathlib.Path('/flag/data')
    assert data_root() == pathlib.Path('/env/data')
    monkeypatch.delenv('SHARD_PARITY_DATA_DIR')
    assert data_root() == pathlib.Path('/xdg/shard-parity')
    monkeypatch.delenv('XDG_CACHE_HOME')
    monkeypatch.setenv('HOME', str(tmp_path))
    assert data_root() == tmp_path / '.cache' / 'shard-parity'


def test_an_empty_file_a_folder_and_zero_images_are_data_faults_naming_the_file(tmp_path):
    """A 0-byte .gz was 'IDX magic number 0x00000000'; an input.txt that is a folder a bare
    [Errno 21]; an MNIST file of 0 images was blamed on --batch_size (exit 2). Each is a data
    fault now (exit 1: shard_parity.exit_status) naming the file."""
    from shard_parity import exit_status

    (tmp_path / 'mnist').mkdir()
    write_mnist(tmp_path / 'mnist')
    mnist.load(tmp_path, download=False)  # loads before the damage
    images = tmp_path / 'mnist' / 'train-images-idx3-ubyte.gz'
    images.write_bytes(b'')
    with pytest.raises(DataError, match=f'{re.escape(str(images))} is 0 bytes and decompresses '
                       'to 0, too few for an IDX header') as empty:  # fmt: skip
        mnist.load(tmp_path, download=False)
    write_idx(images, np.zeros((0, 28, 28), np.uint8))
    write_idx(tmp_path / 'mnist' / 'train-labels-idx1-ubyte.gz', np.zeros(0, np.uint8))
    with pytest.raises(DataError, match=f'{re.escape(str(images))} holds 0 images') as none:
        mnist.load(tmp_path, download=False)
    text = tmp_path / 'tinyshakespeare' / 'input.txt'
    text.mkdir(parents=True)
    for fetch, more in ((False, ''), (True, ' (the file is then downloaded)')):
        with pytest.raises(DataError, match=re.escape(
                f'Tiny Shakespeare file {text} is a folder, not a file: move it aside{more}, or '
                'put the official file there.')) as folder:  # fmt: skip
            shakespeare.load(tmp_path, download=fetch, base_url=closed_port_url())
    assert [exit_status(e.value) for e in (empty, none, folder)] == [1, 1, 1]
