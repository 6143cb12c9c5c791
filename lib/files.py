"""
Files and folders that a crash cannot leave half-made: every file written whole or not at all (atomic_write,
write_json), JSON read with a one-line error (read_json), a folder held by one process at a time (lock_dir, locked),
and the temporaries of killed writers removed (remove_stale_temporaries). Every script that writes uses them.
"""
import atexit
import fcntl
import json
import os
import re
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


def remove_stale_temporaries(path, names):
    """The one owner of what may be deleted behind a user's back: the temporaries `<name>.tmp.<pid>` that
    atomic_write left in path when its process was killed, for the file names its caller writes (regular
    expressions matched in full: run.py's ckpt\\.pt, log\\.jsonl, ckpt_\\d+\\.pt in snapshots/), of processes no
    longer alive here. Any other file, a user's `results.tmp.2` too, is never touched. Call it only while holding
    path's lock."""
    for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
        base, dot, pid = name.rpartition(".tmp.")
        if dot and pid.isdigit() and any(re.fullmatch(n, base) for n in names) and not alive(int(pid)):
            try:
                os.remove(os.path.join(path, name))
            except OSError:
                pass


def alive(pid):
    """A process of this id runs on this machine (another user's too; pid 0 and our own count as alive)."""
    try:
        os.kill(pid, 0) if pid not in (0, os.getpid()) else None
    except ProcessLookupError:
        return False
    except OSError:  # not ours to signal: alive
        pass
    return True


_held = {}  # lock file -> its file descriptor, held until released or the process exits
_made = {}  # folder lock_dir created -> the topmost folder it created for it (out/ for out/run)


@atexit.register
def _tidy():
    """A folder this process created and still holds, left with nothing but its lock (a script refused at start,
    e.g. for missing data), goes again: no empty output folder is left behind."""
    for path, top in _made.items():
        try:
            if os.path.join(path, ".lock") in _held and os.listdir(path) == [".lock"]:
                os.remove(os.path.join(path, ".lock"))
                while True:  # the folder, then the parents made for it, while empty
                    os.rmdir(path)
                    if path == top:
                        break
                    path = os.path.dirname(path)
        except OSError:
            pass


def lock_dir(path, who, name=".lock"):
    """Creates path if needed and holds it for this process: an exclusive flock on path/.lock, whose text names
    the holder. The operating system releases it when the process ends in any way, so the lock of a dead
    process is free again. Another live holder: one line naming it. Another name holds a part of the folder's work
    (studies/jobs.py: one job of a study, whose own script then holds path/.lock)."""
    if not str(path).strip():  # an unset shell variable (--out_dir=$OUT): never the current folder
        raise SystemExit(f"{who.split()[0]}: the output folder is empty (an unset shell variable?): name one, "
                         "e.g. --out_dir=out/run")
    lock = os.path.abspath(os.path.join(path, name))
    if lock in _held:  # this process has it already
        return
    made, top = None, os.path.abspath(path)
    while not os.path.isdir(top):  # the topmost folder makedirs will create
        made, top = top, os.path.dirname(top)
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise SystemExit(f"cannot use {path} as an output folder: {e.strerror}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 300).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise SystemExit(f"{path} is in use by {holder}: wait for it to end, or choose another output folder")
    try:  # the holder's name for a refused second writer (a full disk leaves it empty: still held)
        os.ftruncate(fd, 0)
        os.write(fd, f"{who} (pid {os.getpid()} on {socket.gethostname()})\n".encode())
    except OSError:
        pass
    _held[lock] = fd
    if made:
        _made[os.path.abspath(path)] = made


def unlock_dir(path, name=".lock"):
    fd = _held.pop(os.path.abspath(os.path.join(path, name)), None)
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
