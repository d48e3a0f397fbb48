"""The cache folder resolver: private folders, refused when someone else could write to them."""

import os
import stat

import pytest

from pyg_ugrapher import paths
from pyg_ugrapher.paths import CACHE_ENV, cache_dir, cache_root


@pytest.fixture
def root(tmp_path, monkeypatch):
    path = tmp_path / "outer" / "cache"
    monkeypatch.setenv(CACHE_ENV, str(path))
    return path


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_cache_root_default(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".cache" / "pyg_ugrapher"


def test_creates_private_folders(root):
    folder = cache_dir("datasets", "Cora", "raw")
    assert folder == root / "datasets" / "Cora" / "raw" and folder.is_dir()
    for path in (root.parent, root, root / "datasets", root / "datasets" / "Cora", folder):
        assert mode(path) == 0o700, path
    assert cache_dir("datasets", "Cora", "raw") == folder  # existing folders are accepted


def test_create_false_creates_nothing(root):
    assert cache_dir("kernels", create=False) == root / "kernels"
    assert not root.exists()


@pytest.mark.parametrize("where", ["root", "part"])
def test_refuses_folder_writable_by_others(root, where):
    cache_dir("kernels")
    path = root if where == "root" else root / "kernels"
    os.chmod(path, 0o777)
    with pytest.raises(PermissionError, match=CACHE_ENV) as error:
        cache_dir("kernels")
    assert str(path) in str(error.value) and "writable by group or others" in str(error.value)
    os.chmod(path, 0o720)
    with pytest.raises(PermissionError, match=CACHE_ENV):
        cache_dir("kernels", create=False)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown to another user")
def test_refuses_folder_of_another_user(root):
    folder = cache_dir("kernels")
    os.chown(folder, 12345, -1)
    with pytest.raises(PermissionError, match=CACHE_ENV) as error:
        cache_dir("kernels")
    assert "owned by user id 12345" in str(error.value)


def test_refuses_a_file(root):
    root.parent.mkdir(parents=True)
    root.write_text("")
    with pytest.raises(NotADirectoryError, match=CACHE_ENV):
        cache_dir("kernels")


@pytest.mark.parametrize("part", ["", ".", "..", "/etc", "a/b", "a/../../b"])
def test_bad_parts(root, part):
    with pytest.raises(ValueError, match="parts"):
        paths.cache_dir("kernels", part)
    with pytest.raises(TypeError, match="parts"):
        paths.cache_dir("kernels", 3)
