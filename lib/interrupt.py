"""
Ctrl-C and SIGTERM in every script: one line, exit code 128 + the signal number (130, 143), never a traceback, and
the work finished so far kept. One mechanism in two stages:

- Imported first by a script (before torch): until its work starts, a signal ends the process at once with one
  line. os._exit, not SystemExit: `import torch` swallows exceptions raised inside it and goes on. Nothing is saved
  by then, and every file written by then is atomic.
- `with stops_cleanly("script", "what is kept"):` around the work: a signal raises KeyboardInterrupt where the script
  is, so that a file being written is removed (files.atomic_write) and the whole ones stay; the block then ends the
  process with one line that says what is kept. train.py's loop takes over instead (run.Run.catch_signals): it
  finishes its step and saves first.

The streams a script writes to go through the same mechanism. A closed stdout or stderr (`| head`: BrokenPipeError)
is SIGPIPE, as Unix means it: the output is dropped from then on (Python's documented recipe: the stream onto
os.devnull) and the script stops as on a signal, through its stage's handler (train.py: saved first), without a
line (its reader has gone) and with exit 141; a reader gone only as the script ends (its last output still
buffered) takes that output alone, and the exit code is the script's own. A log kept beside the terminal (log_to) that cannot be written (a full
disk) ends there in one line on the terminal, and the script goes on.
"""
import atexit
import os
import signal
import sys
from contextlib import contextmanager

NAME = os.path.basename(sys.argv[0]).removesuffix(".py") or "python"


def _interrupted(signum, frame, why=None):
    work = "training" if NAME == "train" else "its work"
    if signum != signal.SIGPIPE:  # a closed output: its reader has gone, there is no one to tell
        print(f"{NAME}: interrupted by signal {signum} " + (why or f"before {work} started; nothing was done"),
              file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(128 + signum)


signal.signal(signal.SIGINT, _interrupted)
signal.signal(signal.SIGTERM, _interrupted)


class _Stream:
    """sys.stdout or sys.stderr: a reader that has gone is SIGPIPE to the script (once), and what is written is also
    appended to the log (log_to) while it can be written."""
    log, closed = None, False  # shared by both streams

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        if _Stream.log:
            try:
                _Stream.log.write(text)
                _Stream.log.flush()
            except OSError as e:  # a full disk: the log ends, said where it is still read
                log, _Stream.log = _Stream.log, None
                try:
                    log.close()  # closed, so that nothing is flushed into it at exit
                except OSError:
                    pass
                self.write(f"{NAME}: cannot write its log {log.name} ({e.strerror or e}): the log ends here, the "
                           "output goes on\n")
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._closed()

    def _closed(self):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())  # every later write and the flush at exit go nowhere
        os.close(devnull)
        if _Stream.closed:  # the other stream too (2>&1 | head) while the script stops: once
            return
        _Stream.closed = True
        stop = signal.getsignal(signal.SIGINT)  # the stage's own: at once, stops_cleanly's, train.py's (saved first)
        if callable(stop):
            stop(signal.SIGPIPE, None)
        elif stop != signal.SIG_IGN:
            os._exit(128 + signal.SIGPIPE)

    def __getattr__(self, name):  # fileno, isatty, encoding, ...: the stream's own
        return getattr(self.stream, name)


sys.stdout, sys.stderr = (None if s is None else _Stream(s) for s in (sys.stdout, sys.stderr))


@atexit.register  # the first registered, so the last to run: a reader gone at the end takes away the output alone,
def _at_exit():  # the work is done and the exit code is the script's own
    _Stream.closed = True
    for s in (sys.stdout, sys.stderr):
        if s is not None:
            s.flush()


def log_to(path):
    """From now on everything the script prints is also appended to the file at path (its log, beside the terminal)."""
    try:
        _Stream.log = open(path, "a")
    except OSError as e:
        raise SystemExit(f"{NAME}: cannot write its log {path} ({e.strerror or e})")


@contextmanager
def stops_cleanly(who, kept):
    """The block's work stops on SIGINT or SIGTERM (a KeyboardInterrupt where it is), then one line on stderr, `who:
    interrupted by signal N; <kept>`, and exit 128 + N (a closed output, SIGPIPE: the same stop, without the line)."""
    got = []

    def interrupt(signum, frame):
        got.append(signum)
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second one while the first cleans up: at once, still one line
            signal.signal(sig, lambda n, f: _interrupted(n, f, "again: stopped at once"))
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    try:
        yield
    except KeyboardInterrupt:
        signum = got[0] if got else signal.SIGINT
        if signum != signal.SIGPIPE:
            print(f"{who}: interrupted by signal {signum}; {kept}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum) from None
