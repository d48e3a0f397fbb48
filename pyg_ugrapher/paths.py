"""The cache folder: where pyg_ugrapher writes what it can make again (generated kernels, processed
copies of datasets).

``$PYG_UGRAPHER_CACHE`` names it, by default ``~/.cache/pyg_ugrapher``. Generated kernels are Python
files, so whoever can write to the folder could choose code that runs in the user's process: a
folder owned by another user, or writable by group or others, is refused, and folders created here
are private (``0700``). Only the standard library is imported here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Environment variable naming the cache folder (default ``~/.cache/pyg_ugrapher``).
CACHE_ENV = "PYG_UGRAPHER_CACHE"


def cache_root() -> Path:
    """The cache folder that ``$PYG_UGRAPHER_CACHE`` names, or ``~/.cache/pyg_ugrapher``, as an
    absolute path (created by :func:`cache_dir`, not here)."""
    env = os.environ.get(CACHE_ENV)
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "pyg_ugrapher").absolute()


def cache_dir(*parts: str, create: bool = True) -> Path:
    r"""The folder ``parts`` inside the cache folder (:func:`cache_root`), checked to be safe.

    Every folder from the cache folder down to the one asked for must be owned by the current user
    and writable by no one else; missing ones are created with mode ``0700``.

    Args:
        \*parts (str): folder names below the cache folder, one per level, e.g. ``"kernels"``.
        create (bool, optional): create missing folders; otherwise missing folders are left
            missing and only existing ones are checked. (default: :obj:`True`)

    Raises:
        TypeError: if a part is not a string.
        ValueError: if a part is not one folder name (empty, ``..``, absolute, or with a separator).
        NotADirectoryError: if the cache folder or a part is a file.
        PermissionError: if a folder is owned by another user or writable by group or others.
    """
    for part in parts:
        if not isinstance(part, str):
            raise TypeError(f"Argument 'parts' must be folder names (strings), got {type(part).__name__}")
        if Path(part).parts != (part,) or part == "..":
            raise ValueError(
                f"Argument 'parts' must be folder names, one per part, inside the cache folder (got {part!r})"
            )
    root = cache_root()
    # Top down, so that nothing is created inside a folder that is refused.
    for depth in range(len(parts) + 1):
        path = root.joinpath(*parts[:depth])
        if not path.exists():
            if not create:
                break
            _make_private(path)
        _check(path)
    return root.joinpath(*parts)


def _make_private(folder: Path) -> None:
    """Create ``folder`` and its missing parents with mode ``0700`` (whatever the umask)."""
    missing = []
    path = folder
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue  # another process made it first
        os.chmod(path, 0o700)


def _check(path: Path) -> None:
    """Refuse ``path`` unless it is a folder that only the current user can write to."""
    info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(
            f"Cache folder {str(path)!r} is not a folder; set {CACHE_ENV} to a folder that only you can write to"
        )
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise PermissionError(
            f"Cache folder {str(path)!r} is owned by user id {info.st_uid}, not by you (user id {os.geteuid()}): "
            f"its files could run code in this process. Set {CACHE_ENV} to a folder of your own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"Cache folder {str(path)!r} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"its files could run code in this process. Run 'chmod go-w {path}' or set {CACHE_ENV} to a "
            f"folder that only you can write to"
        )
