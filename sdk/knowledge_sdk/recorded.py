"""The address `knowledge serve` recorded in its data directory (``DATA_DIR/server.json``),
read as the CLI, the MCP bridge and the prompt hook read it: only from a file this user
wrote, naming a service on this machine.

The hook sends every prompt, with the bearer token, to the address it finds. A file another
user could write (a data directory under ``/tmp``, a shared one) or a relative data
directory (resolved against the harness's working directory, a cloned repository's) could
send them elsewhere, so such a file is not read, and an address that is not a loopback one
is not followed: give ``--address`` or ``KNOWLEDGE_ADDRESS`` for a service on another host.

A file a killed service left is not followed either: `knowledge serve` holds an exclusive
lock on ``DATA_DIR/locks/serve.lock`` while it runs (the kernel drops it when the process
dies), so a file whose lock nobody holds names a port another program may hold by now.
"""

from __future__ import annotations

import fcntl
import grp
import ipaddress
import json
import os
import pwd
import stat
from pathlib import Path

SERVER_FILE = "server.json"
# Held (flock, exclusive) by the `knowledge serve` that has the data directory.
SERVE_LOCK = ("locks", "serve.lock")

__all__ = ["SERVER_FILE", "SERVE_LOCK", "is_loopback", "recorded_address"]


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` (or ``[v6]:port``) names this machine: ``localhost``, a
    loopback IP address, or the unspecified one a service on every interface records."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    # A service listening on every interface records 0.0.0.0 (or ::): dialled, it is this
    # machine's.
    return ip.is_loopback or ip.is_unspecified


def _private_group(gid: int) -> bool:
    """Whether group ``gid`` is this user's private group: named as the user, with no
    other member."""
    try:
        name = pwd.getpwuid(os.getuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == name and set(group.gr_mem) <= {name}


def _own(info: os.stat_result) -> bool:
    """This user's, and no other user may write it."""
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _private_dir(info: os.stat_result) -> bool:
    """A directory of this user's that other users may not write: its group only when the
    group is this user's private one (a umask of 002 gives it the group's write bit),
    never a group shared with others."""
    if info.st_uid != os.getuid() or info.st_mode & stat.S_IWOTH:
        return False
    return not (info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid))


def _served(dir_fd: int) -> bool:
    """Whether a `knowledge serve` holds the data directory's serve lock now. Probed with
    a shared lock taken and dropped at once (the server, starting, waits out such a probe
    rather than taking it for another server)."""
    # Links followed, as the server follows them when it takes the lock; where they lead
    # must be this user's alone too (a lock another user can make or hold would pass a dead
    # server's file for a live one's), and opening never waits (a FIFO planted there).
    try:
        locks = os.open(SERVE_LOCK[0], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        if not _private_dir(os.fstat(locks)):
            return False
        fd = os.open(SERVE_LOCK[1], os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=locks)
    except OSError:
        return False
    finally:
        os.close(locks)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not _own(info):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # drops the probe's lock
    return False


def recorded_address(data_dir: Path | str) -> str | None:
    """The address recorded in ``data_dir/server.json``, or None: when there is none, the
    data directory is relative or not this user's alone (another user could put back an
    old file of this user's, naming a port they now hold), the file is not a regular file
    this user owns that no other user may write, it holds no address, or the address is
    not a loopback one, or no `knowledge serve` holds the directory (the file is a killed
    one's). The file is opened through the directory checked, never by its path again."""
    directory = Path(data_dir)
    if not directory.is_absolute():
        return None
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        # The data directory this user's alone, then a server holding it.
        if not _private_dir(os.fstat(dir_fd)) or not _served(dir_fd):
            return None
        fd = os.open(SERVER_FILE, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not _own(info) or info.st_size > 64 * 1024:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    address = data.get("address") if isinstance(data, dict) else None
    if not isinstance(address, str) or not address or not is_loopback(address):
        return None
    return address
