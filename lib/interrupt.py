"""
Imported by train.py before torch: until the training loop takes over (run.Run.catch_signals), a Ctrl-C or SIGTERM
ends the process at once with one line and exit code 128 + the signal number. os._exit, not SystemExit: `import
torch` swallows exceptions raised inside it and goes on. Nothing is saved before the loop, and every file written
by then is atomic.
"""
import os
import signal
import sys


def _interrupted(signum, frame):
    print(f"train: interrupted by signal {signum} before training started", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(128 + signum)


signal.signal(signal.SIGINT, _interrupted)
signal.signal(signal.SIGTERM, _interrupted)
