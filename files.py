"""
Files and folders that a crash cannot leave half-made: every file written whole or not at all (atomic_write,
write_json), JSON read with a one-line error (read_json), a folder held by one process at a time (lock_dir, locked),
and the temporaries of killed writers removed (remove_stale_temporaries). Every script that writes uses them.
"""
import fcntl
import json
import os
import socket
from contextlib import contextmanager

from configurator import oneline


def atomic_write(path, write, mode="wb"):
    """Write a file whole or not at all: write(f) fills path.tmp.<pid>, which is flushed to disk and renamed over
    path. On any failure (a full disk, Ctrl-C) the temporary file is removed and path is as it was; a failure of
    the disk itself ends in one line."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise SystemExit(f"cannot write {path}: {e.strerror or e}; it is unchanged") from None
        raise


def write_json(path, obj):
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=1) + "\n"), mode="w")


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SystemExit(f"cannot read {what} {path} ({oneline(e)}); it was left as it is")


def remove_stale_temporaries(path):
    """Removes the *.tmp.<pid> files that writes killed mid-way left in path (and path/snapshots): call it only
    while holding path's lock, so that no live writer owns them."""
    for folder in (path, os.path.join(path, "snapshots")):
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            if ".tmp." in name and name.rsplit(".tmp.", 1)[1].isdigit():
                try:
                    os.remove(os.path.join(folder, name))
                except OSError:
                    pass


_held = {}  # folder -> file descriptor of its lock, held until released or the process exits


def lock_dir(path, who):
    """Creates path if needed and holds it for this process: an exclusive flock on path/.lock, whose text names
    the holder. The operating system releases it when the process ends in any way, so the lock of a dead
    process is free again. Another live holder: one line naming it."""
    if os.path.abspath(path) in _held:  # this process has it already
        return
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise SystemExit(f"cannot use {path} as an output folder: {e.strerror}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 300).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise SystemExit(f"{path} is in use by {holder}: wait for it to end, or choose another output folder")
    os.ftruncate(fd, 0)
    os.write(fd, f"{who} (pid {os.getpid()} on {socket.gethostname()})\n".encode())
    _held[os.path.abspath(path)] = fd


def unlock_dir(path):
    fd = _held.pop(os.path.abspath(path), None)
    if fd is not None:
        os.close(fd)


@contextmanager
def locked(path, who):
    """`with locked(folder, 'script.py'):` the folder is this process's for the block (see lock_dir)."""
    lock_dir(path, who)
    try:
        yield
    finally:
        unlock_dir(path)
