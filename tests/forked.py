"""`python SCRIPT ARGS` for the tests, without paying for `import torch` each time: a fork server (the standard
library's) that has imported torch (with torch._dynamo), numpy and tiktoken forks a child per call, which then runs
the script as `python` would: its own argv, cwd, environment, stdout and stderr, `__name__ == "__main__"`, the exit
code of its SystemExit (a message: printed, exit 1), a traceback and exit 1 for any other exception, atexit handlers
at the end. The study runners' jobs start the same way in the tests (Child: studies/jobs.py, with STUDY_JOBS_FORKED
set by tests/conftest.py). Nothing of the project is imported before the fork, so every call imports it afresh. What
depends on a fresh interpreter (a signal while torch loads, Python's own start-up) is tested with a real subprocess
instead."""
import multiprocessing
import os
import subprocess
import sys
import time
import types

PRELOAD = ["torch", "torch._dynamo", "numpy", "tiktoken"]  # torch._dynamo: every optimizer made imports it (+2.5 s)
_context = None


def _child(argv, cwd, env, out, err):
    """In the forked child: the script as `python argv...` would run it, its output appended to the files out and
    err; never returns."""
    import atexit
    import runpy
    import threading
    import traceback
    code = 1
    try:
        for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                               (2, err, os.O_WRONLY | os.O_APPEND | os.O_CREAT)):
            os.dup2(os.open(path, mode), fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        import torch
        torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1))  # read at its import, before
        sys.argv = list(argv)
        try:
            if argv[0] == "-c":
                sys.argv = ["-c", *argv[2:]]
                sys.path[0] = ""
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
            else:
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if not isinstance(e.code, int) and e.code is not None:
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        threading._shutdown()  # what Python's own exit does: wait for the script's threads, then atexit
        atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # a closed or broken stream: nothing more to say
                pass
        os._exit(code)


def _start(target, args):
    """A started child of the fork server. A script's own __main__ is hidden while it starts: multiprocessing would
    otherwise run that script again in the child (spawn.prepare) before the target, the runner's imports with it."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    p, main = _context.Process(target=target, args=args), sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        p.start()
    finally:
        sys.modules["__main__"] = main
    return p


class Child:
    """`subprocess.Popen([python, *argv], cwd, env, stdout=log, stderr=log)` through the fork server, with the
    Popen calls the study runners' jobs use (studies/jobs.py: run_jobs, when STUDY_JOBS_FORKED is set)."""
    def __init__(self, argv, cwd, env, log):
        open(log, "a").close()  # there even if the child dies before it runs the script
        self.process = _start(_child, (list(argv), cwd, dict(env), log, log))
        self.pid = self.process.pid

    @property
    def returncode(self):  # Popen's: -N for a signal N
        return self.process.exitcode

    def poll(self):
        return self.process.exitcode

    def wait(self):
        self.process.join()
        return self.process.exitcode

    def send_signal(self, sig):
        if self.process.exitcode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # it ended meanwhile (Popen's too)
                pass


def run(argv, cwd, env, timeout):
    """subprocess.run([python, *argv], cwd, env, capture_output=True, text=True, timeout) through the fork server."""
    base = os.path.join(env.get("TMPDIR") or "/tmp", f"forked-{os.getpid()}-{time.monotonic_ns()}")
    out, err = base + ".out", base + ".err"
    try:
        for path in (out, err):
            open(path, "w").close()
        p = _start(_child, (list(argv), cwd, dict(env), out, err))
        p.join(timeout)
        if p.exitcode is None:
            p.kill()
            p.join()
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
        with open(out, errors="replace") as fo, open(err, errors="replace") as fe:
            return subprocess.CompletedProcess([sys.executable, *argv], p.exitcode, fo.read(), fe.read())
    finally:
        for path in (out, err):
            if os.path.exists(path):
                os.remove(path)
