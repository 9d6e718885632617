"""Reading a file that untrusted data names or places (a harness's log folder, a skill
catalog, a subagent's metadata) without blocking on a FIFO or a device, and without
reading more than a limit.

``open()`` of a FIFO waits for a writer, forever if none comes, and holds whatever lock
the caller holds meanwhile; a device may never end. Here the file is opened without
waiting (``O_NONBLOCK``), checked to be a regular file on the open descriptor (no race
with a swap after a check by name), and read up to ``limit`` bytes.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NotRegularFile", "TooLarge", "read_regular"]


class NotRegularFile(OSError):
    """The path is a FIFO, a socket, a device or a folder."""


class TooLarge(OSError):
    """The file holds more than the caller's limit (``size``: its size in bytes)."""

    def __init__(self, path: str, size: int) -> None:
        super().__init__(errno.EFBIG, f"file too large ({size} bytes)", path)
        self.size = size


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; NotRegularFile
    or TooLarge (both OSError) otherwise, as any other failure to read it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        if info.st_size > limit:
            raise TooLarge(path, info.st_size)
        os.set_blocking(fd, True)
        parts = []
        left = limit + 1
        while left > 0:
            part = os.read(fd, min(left, 1 << 20))
            if not part:
                break
            parts.append(part)
            left -= len(part)
        data = b"".join(parts)
        if len(data) > limit:  # grew since fstat
            raise TooLarge(path, len(data))
        return data
    finally:
        os.close(fd)
