"""
Files and folders that a crash cannot leave half-made: every file written whole or not at all (atomic_write,
write_json, copy_file), JSON read with a one-line error (read_json), an archive read whole or refused (read_tar,
tar_writer), a folder held by one process at a time (lock_dir, locked), and the temporaries of killed writers
removed (remove_stale_temporaries). Every script that writes uses them.
"""
import atexit
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import socket
import tarfile
import zlib
from contextlib import contextmanager

from configurator import oneline


def staged(path):
    return f"{path}.tmp.{os.getpid()}"  # a file written beside path, to be renamed over it once whole


def stage(path, write, mode="wb"):
    """write(f) fills staged(path), flushed to disk: its name. On any failure it is removed and the error raised."""
    tmp = staged(path)
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        return tmp
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def atomic_write(path, write, mode="wb"):
    """Write a file whole or not at all: write(f) fills staged(path), which is flushed to disk and renamed over
    path. On any failure (a full disk, Ctrl-C) the temporary file is removed and path is as it was; a failure of
    the disk itself ends in one line."""
    try:
        os.replace(stage(path, write, mode), path)
    except BaseException as e:
        try:
            os.remove(staged(path))
        except OSError:
            pass
        if isinstance(e, OSError):
            raise SystemExit(f"cannot write {path}: {e.strerror or e}; it is unchanged") from None
        raise


def write_json(path, obj):
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=1) + "\n"), mode="w")


def copy_file(src, dest):
    """src copied to dest whole or not at all (atomic_write); nothing to do where they are one file (a folder given
    as its own source, e.g. --glue_dir=<carry>/glue)."""
    try:
        if os.path.exists(dest) and os.path.samefile(src, dest):
            return
        with open(src, 'rb') as f:
            atomic_write(dest, lambda g: shutil.copyfileobj(f, g, 1 << 24))
    except OSError as e:
        raise SystemExit(f"cannot copy {src} to {dest}: {e.strerror or e}")


MANIFEST = 'MANIFEST'  # tar_writer's first member: every other member's name and sha256 (no .json: never a record)


def tar_writer(members, mode='w'):
    """write(f) for atomic_write: a tar ('w:gz': compressed) of members [(path, its name inside)], its first member
    MANIFEST, which read_tar checks the rest against (a tar's own headers do not say how many members follow)."""
    def write(f):
        with tarfile.open(fileobj=f, mode=mode) as t:
            sums = {}
            for p, name in members:
                with open(p, 'rb') as g:
                    sums[name] = hashlib.sha256(g.read()).hexdigest()
            data = json.dumps({'members': sums}, indent=1).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
            for p, name in members:
                t.add(p, arcname=name)
    return write


def read_tar(path, who):
    """[(member, its bytes or None for a non-file)] of a tar or tar.gz, read whole or refused in one line, `who: path is
    not a whole archive (why)`. Python's tarfile ends the member list in silence at a damaged header, and gzip's
    checksum is met only at the stream's end: so every member's data is read, then the stream to its end, which must
    be the zero blocks a tar ends with. Where tar_writer wrote it, its MANIFEST must list every other member, with
    its sha256 (the manifest is not returned)."""
    def refuse(why):
        raise SystemExit(f"{who}: {path} is not a whole archive ({why})")
    try:
        with tarfile.open(path) as t:
            members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]
            t.fileobj.seek(t.offset)  # where tarfile stopped: the end-of-archive blocks, or a header it could not read
            rest = t.fileobj.read()
    except (OSError, EOFError, tarfile.TarError, zlib.error) as e:  # EOFError: a cut .gz; OSError: a bad CRC
        refuse(oneline(e))
    if len(rest) < 2 * tarfile.BLOCKSIZE or rest.strip(b'\0'):
        refuse(f"a damaged header or its end cut {f'after {members[-1][0].name}' if members else 'at its start'}: "
               f"{len(members)} members read")
    if members and members[0][0].name == MANIFEST:
        try:
            want = json.loads(members[0][1])['members']
            if not isinstance(want, dict):
                raise ValueError("its members are not an object")
        except (TypeError, ValueError, KeyError) as e:
            refuse(f"its {MANIFEST} is damaged: {oneline(e)}")
        members = members[1:]
        have = {m.name: hashlib.sha256(d).hexdigest() for m, d in members if d is not None}
        if len(members) != len(want) or have != want:
            refuse(f"{len(members)} members, its {MANIFEST} lists {len(want)}" if len(members) != len(want) else
                   f"a member differs from its {MANIFEST}")
    return members


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SystemExit(f"cannot read {what} {path} ({oneline(e)}); it was left as it is")


def check_replaceable(path, ours, who, what, shown=None):
    """Before any work: path holds nothing, or a JSON file of this script's (ours(its object) is true), which it may
    replace. Anything else there (a user's file, a folder, another tool's JSON) is never replaced: one line (naming the
    path as `shown`), and it is left as it is."""
    if not os.path.lexists(path):
        return
    try:
        old = read_json(path, what)
    except SystemExit:  # unreadable, a folder, not JSON
        old = None
    if not (isinstance(old, dict) and ours(old)):
        raise SystemExit(f"{who}: {shown or path} is there and is no {what}: it is left as it is; name another path, "
                         "or move it away")


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


def _unmake(path):
    """The folder lock_dir created for path, left with nothing but its lock (a script refused at start, e.g. for
    missing data), goes again, with the parents made for it: no empty output folder is left behind."""
    top = _made.pop(path, None)
    try:
        if top and set(os.listdir(path)) <= {".lock"}:
            if os.path.exists(os.path.join(path, ".lock")):
                os.remove(os.path.join(path, ".lock"))
            while True:  # the folder, then the parents made for it, while empty
                os.rmdir(path)
                if path == top:
                    break
                path = os.path.dirname(path)
    except OSError:
        pass


@atexit.register
def _tidy():
    """At exit, the folders still held (train.py holds its out_dir to the end): each as unlock_dir leaves it."""
    for path in [p for p in _made if os.path.join(p, ".lock") in _held]:
        _unmake(path)


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
        if name == ".lock":
            _unmake(os.path.abspath(path))  # made here and left empty (refused before it wrote anything): gone
        os.close(fd)


@contextmanager
def locked(path, who):
    """`with locked(folder, 'script.py'):` the folder is this process's for the block (see lock_dir)."""
    lock_dir(path, who)
    try:
        yield
    finally:
        unlock_dir(path)
