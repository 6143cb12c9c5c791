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
"""
import os
import signal
import sys
from contextlib import contextmanager

NAME = os.path.basename(sys.argv[0]).removesuffix(".py") or "python"


def _interrupted(signum, frame, why=None):
    work = "training" if NAME == "train" else "its work"
    print(f"{NAME}: interrupted by signal {signum} " + (why or f"before {work} started; nothing was done"),
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(128 + signum)


signal.signal(signal.SIGINT, _interrupted)
signal.signal(signal.SIGTERM, _interrupted)


@contextmanager
def stops_cleanly(who, kept):
    """The block's work stops on SIGINT or SIGTERM (a KeyboardInterrupt where it is), then one line on stderr, `who:
    interrupted by signal N; <kept>`, and exit 128 + N."""
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
        print(f"{who}: interrupted by signal {signum}; {kept}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum) from None
