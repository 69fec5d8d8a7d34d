"""Making a file's or a directory's contents durable (POSIX `fsync` of a path)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_path"]


def fsync_path(path: Path) -> None:
    """`fsync` the file or directory at `path`: for a directory, the renames and new
    entries inside it become durable (POSIX: sync the directory itself)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
