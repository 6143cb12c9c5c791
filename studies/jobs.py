"""
What the studies (study.py, study_glue.py) share: the jobs they launch (python scripts, a few at a time, each in its own
folder), the record a finished pre-training run leaves in assets/ (its settings, U and its eval records: a few KB,
committed), what a record is checked against, and U itself.
"""
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from typing import Callable, NamedTuple

import torch

from configurator import configure, oneline, script_defaults
from lib.checkpoint import load_checkpoint
from lib.dataloader import frequency_only_loss, load_dataset
from lib.files import atomic_write, locked
from lib.run import MACHINE_KEYS, run_changes
from plot import read_evals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
RUN_KEYS_IGNORED = tuple(k for k in MACHINE_KEYS if k != 'dtype')  # where a run ran; its precision counts


# ----------------------------------------------------------------------------- jobs
class Job(NamedTuple):
    name: str  # in its messages
    folder: str  # its working folder: free when it starts (a train.py there: one line, nothing started)
    log: str  # its output, appended to <folder>/<log>
    argv: list  # the script and its arguments
    done: Callable[[], str]  # once it ended well: writes its record, returns what the 'done' line says after it
    needs: str = ''  # a file that must be there before it starts (the record of a job it follows)


def run_jobs(todo, at_once, threads, who, may_start=None):  # may_start(job, running names): True starts it,
    # None not yet, False never in this call (a deadline); it is asked only once what the job needs is there
    """Runs the jobs in their order, `at_once` at a time, each once what it needs is there, with `threads` torch
    threads each (0: torch's default). A failed job, Ctrl-C or a scheduler's stop (SIGTERM, made a
    KeyboardInterrupt by the caller) stops the others with SIGINT (train.py saves first); the same command then
    continues."""
    todo, running = list(todo), {}
    env = {**os.environ, **({'OMP_NUM_THREADS': str(threads)} if threads else {})}
    try:
        while todo or running:
            ready = [j for j in todo if not j.needs or os.path.exists(j.needs)]
            while ready and len(running) < at_once:
                job = ready.pop(0)
                if may_start and (go := may_start(job, list(running))) is not True:
                    if go is False:
                        todo.remove(job)
                    continue
                todo.remove(job)
                with locked(job.folder, f'{who}.py'):  # makes the folder; held by another: one line
                    pass
                with open(os.path.join(job.folder, job.log), 'a') as f:
                    p = subprocess.Popen([sys.executable, *job.argv], stdout=f, stderr=subprocess.STDOUT, env=env)
                running[job.name] = (p, job, time.time())
                print(f"  started {job.name}", flush=True)
            if not running and todo:
                raise SystemExit(f"{who}: the jobs left wait for records that are not there: "
                                 f"{', '.join(dict.fromkeys(j.needs for j in todo))}")
            time.sleep(2)
            for name, (p, job, t0) in list(running.items()):
                if p.poll() is None:
                    continue
                del running[name]
                if p.returncode:
                    with open(os.path.join(job.folder, job.log), errors='replace') as f:
                        last = (f.read().strip().splitlines() or [''])[-1]
                    raise SystemExit(f"{who}: {name} failed (exit {p.returncode}): {last}")
                print(f"  done {name} in {(time.time() - t0) / 60:.1f} min: {job.done()}", flush=True)
    except BaseException:
        for p, *_ in running.values():
            p.send_signal(signal.SIGINT)
        for p, *_ in running.values():
            p.wait()
        if sys.exc_info()[0] is KeyboardInterrupt:
            raise SystemExit(f"{who}: interrupted; the same command continues where it stopped")
        raise


# ----------------------------------------------------------------------------- records
def read_record(path, who='study'):
    """(head, eval records) of a committed run record, head holding the run's config and U; None if there is none.
    A damaged one stops the script `who` with one line."""
    if not os.path.exists(path):
        return None
    try:  # every line whole: a record is written at once (atomic_write), so a cut or damaged one is never read
        with open(path, 'rb') as f:
            lines = f.read().split(b'\n')
        if lines[-1]:
            raise ValueError("its last line is cut")
        head, _ = json.loads(lines[0]), [json.loads(line) for line in lines[1:-1]]
        head['config'], head['unigram_loss']
    except (OSError, ValueError, KeyError, TypeError) as e:  # a bad byte (UnicodeDecodeError) is a ValueError
        raise SystemExit(f"{who}: {path} is not a whole study record ({oneline(e)}): restore it (git checkout "
                         f"{path}) or move it away and run again")
    try:
        return head, read_evals(path)
    except SystemExit as e:
        raise SystemExit(f"{who}: {e}; move it away and run again")


def write_record(path, run, command, u):
    """The run's settings and its eval records (from out_dir/log.jsonl) as the committed record."""
    settings = load_checkpoint(os.path.join(run, 'ckpt.pt'))['config']
    head = {'type': 'config', 'config': settings, 'unigram_loss': u, 'command': command, 'torch': torch.__version__,
            'machine': f"{platform.machine()}, {os.cpu_count()} cores", 'cpu': cpu_name(), 'commit': code_commit(),
            'date': datetime.date.today().isoformat()}
    lines = [json.dumps(head)] + [json.dumps({k: round(v, 4) if isinstance(v, float) and k != 'loss' else  # loss
                                                 [round(e, 4) for e in v] if isinstance(v, list) else v  # exact: the
                                              for k, v in r.items()}) for r in read_evals(run)]  # criterion reads it
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    atomic_write(path, lambda f: f.write('\n'.join(lines) + '\n'), mode='w')


def cpu_name():
    try:
        with open('/proc/cpuinfo') as f:
            names = [line.split(':', 1)[1].strip() for line in f if line.startswith('model name')]
    except OSError:
        names = []
    return names[0] if names else platform.processor()


def code_commit():
    """The git commit of the code that trains (runs train from a clone of a fixed commit), '+changes' if its tracked
    files differ from it; None outside git."""
    git = lambda *a: subprocess.run(['git', '-C', ROOT, *a], capture_output=True, text=True)
    head = git('rev-parse', 'HEAD')
    if head.returncode:
        return None
    return head.stdout.strip() + ('+changes' if git('status', '--porcelain', '--untracked-files=no').stdout else '')


def differ(have, cmd):
    """What makes the run made with the settings `have` another run than the train.py command cmd asks for (not
    where it ran, nor how far: see run.run_changes). A setting newer than the run counts at train.py's default,
    which is what the run did."""
    have = {**script_defaults(os.path.join(ROOT, 'train.py')), **have}
    return run_changes(have, configure(dict(have), argv=cmd), ignore=RUN_KEYS_IGNORED)


def unigram_loss(data_dir, block_size, batch_size, eval_iters):
    """U of a dataset (dataloader.frequency_only_loss) over the eval blocks train.py uses (the first eval_iters *
    batch_size of val.bin), from every train token: the records keep it, and a study checks its data against it."""
    train, val, meta = load_dataset(data_dir, None, block_size)
    return frequency_only_loss(train, val[:eval_iters * batch_size], min(meta['special'].values()),
                               max_tokens=train.size)
