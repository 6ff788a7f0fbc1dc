"""Reading checkpoint files safely: regular files only, never a FIFO, device or socket.

A FIFO named config.json would block open() until a writer appears (forever), and a device
such as /dev/zero would be read without end. Every checkpoint file is therefore opened with
O_NONBLOCK (opening a FIFO returns at once), checked to be a regular file on the open
descriptor (no race with a rename), and read up to a size limit.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from pagedllm.model.errors import CheckpointError

# Largest JSON file read (tokenizer.json of a 256k vocabulary is ~20 MB).
MAX_JSON_BYTES = 256 << 20


def check_regular_file(path: str) -> None:
    """Refuses anything at `path` but a regular file (symlinks to one are followed).

    Args:
        path: the file.
    Raises:
        CheckpointError: it is missing, or a FIFO, socket, device or directory.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: is a {_kind(mode)}, expected a regular file")


def read_regular_bytes(path: str, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The contents of a regular file of at most `max_bytes` bytes.

    Args:
        path: the file.
        max_bytes: the largest size accepted.
    Returns:
        The bytes.
    Raises:
        CheckpointError: missing, not a regular file, unreadable, or larger than max_bytes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path}: is a {_kind(st.st_mode)}, expected a regular file")
        if st.st_size > max_bytes:
            raise CheckpointError(f"{path}: is {st.st_size} bytes, expected at most {max_bytes}")
        with os.fdopen(fd, "rb") as f:
            fd = -1  # owned by f now
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:
        raise CheckpointError(f"{path}: is larger than {max_bytes} bytes")
    return data


def read_json(path: str, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """Loads a JSON object from a regular file.

    Args:
        path: the file.
        max_bytes: the largest size accepted.
    Returns:
        The object.
    Raises:
        CheckpointError: as read_regular_bytes, or not valid UTF-8 JSON, or not an object.
    """
    data = read_regular_bytes(path, max_bytes)
    try:
        d = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON, an int of > 4300 digits
        raise CheckpointError(f"{path}: cannot be read as JSON ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(d).__name__}")
    return d


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"
