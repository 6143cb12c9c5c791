"""
What the studies (study.py, study_glue.py) share: the jobs they launch (python scripts, a few at a time, each in its own
folder), the record a finished pre-training run leaves in assets/ (its settings, U and its eval records: a few KB,
committed), what a record is checked against, and U itself.
"""
import copy
import datetime
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, NamedTuple

import torch

from configurator import configure, oneline, read_file, script_defaults
from lib.checkpoint import load_checkpoint
from lib.dataloader import frequency_only_loss, load_dataset
from lib.files import atomic_write, lock_dir, locked, unlock_dir
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
    recorded: Callable[[], bool] = lambda: False  # its record is there (another launcher ran it since): skipped


def job_lock(job):
    """The lock file of the job in its folder, held by its launcher from its start to its record (its script holds
    the folder's own .lock)."""
    return f".{os.path.splitext(job.log)[0]}.lock"


def launch(argv, log, env):
    """`python argv`, its output appended to the file log. With STUDY_JOBS_FORKED set (the tests: toy jobs of
    seconds, most of each its `import torch`), a child of tests/forked.py's fork server, which has imported it."""
    if env.get('STUDY_JOBS_FORKED'):
        if 'forked' not in sys.modules:
            sys.path.insert(0, os.path.join(ROOT, 'tests'))
        import forked
        return forked.Child(argv, os.getcwd(), env, log)
    with open(log, 'a') as f:
        return subprocess.Popen([sys.executable, *argv], stdout=f, stderr=subprocess.STDOUT, env=env)


def run_jobs(todo, at_once, threads, who, may_start=None):  # may_start(job, running names): True starts it,
    # None not yet, False never in this call (a deadline); it is asked only once what the job needs is there
    """Runs the jobs in their order, `at_once` at a time, each once what it needs is there, with `threads` torch
    threads each (0: torch's default). A failed job, Ctrl-C or a scheduler's stop (SIGTERM, made a
    KeyboardInterrupt by the caller's interrupt.stops_cleanly) stops the others with SIGINT (train.py saves first),
    waits for them and raises again; the same command then continues. Each job is held (job_lock) from before it
    starts until its record is written: a second launcher on the same folders is refused it with one line while it
    runs, and skips it once it is recorded; it never runs it again."""
    todo, running, held = list(todo), {}, []
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
                lock_dir(job.folder, f'{who}.py, {job.name}', job_lock(job))  # makes the folder; another's: one line
                held.append(job)
                if job.recorded():  # another launcher ran it since the plan
                    unlock_dir(job.folder, job_lock(job))
                    held.remove(job)
                    print(f"  {job.name}: recorded meanwhile (another {who}), skipped", flush=True)
                    continue
                with locked(job.folder, f'{who}.py'):  # its script's own lock: a train.py there is one line
                    pass
                p = launch(job.argv, os.path.join(job.folder, job.log), env)
                running[job.name] = (p, job, time.time())
                print(f"  started {job.name}", flush=True)
            if not running and todo:
                raise SystemExit(f"{who}: the jobs left wait for records that are not there: "
                                 f"{', '.join(dict.fromkeys(j.needs for j in todo))}")
            if not running:  # the last ones were recorded meanwhile
                break
            time.sleep(0.2)  # a job's end seen at once: a study at toy sizes is many jobs of seconds
            for name, (p, job, t0) in list(running.items()):
                if p.poll() is None:
                    continue
                del running[name]
                if p.returncode:
                    with open(os.path.join(job.folder, job.log), errors='replace') as f:
                        last = (f.read().strip().splitlines() or [''])[-1]
                    raise SystemExit(f"{who}: {name} failed (exit {p.returncode}): {last}")
                print(f"  done {name} in {(time.time() - t0) / 60:.1f} min: {job.done()}", flush=True)
                unlock_dir(job.folder, job_lock(job))  # recorded: another launcher now skips it
                held.remove(job)
    except BaseException:
        for p, *_ in running.values():
            p.send_signal(signal.SIGINT)
        for p, *_ in running.values():
            p.wait()
        raise
    finally:
        for job in held:
            unlock_dir(job.folder, job_lock(job))


# ----------------------------------------------------------------------------- what a study reads, checked
# A spec says what a study reads of a file: a kind (KINDS), {key: spec} for an object with those keys (key? when it may
# be absent, '*' for every key: at least one), [spec] for a list of at least one such item.
KINDS = {'a finite number': lambda v: type(v) in (int, float) and math.isfinite(v),
         'a number > 0': lambda v: type(v) in (int, float) and math.isfinite(v) and v > 0,
         'a number >= 0': lambda v: type(v) in (int, float) and math.isfinite(v) and v >= 0,
         'a fraction in [0, 1]': lambda v: type(v) in (int, float) and 0 <= v <= 1,
         'a score in [-100, 100]': lambda v: type(v) in (int, float) and -100 <= v <= 100,
         'a percentage in [0, 100]': lambda v: type(v) in (int, float) and 0 <= v <= 100,
         'true or false': lambda v: type(v) is bool,
         'a step (a whole number >= 0)': lambda v: type(v) is int and v >= 0,
         'a step or null': lambda v: v is None or type(v) is int and v >= 0,
         'a whole number >= 1': lambda v: type(v) is int and v >= 1,
         'a string': lambda v: isinstance(v, str), 'a string or null': lambda v: v is None or isinstance(v, str),
         'an object': lambda v: isinstance(v, dict),
         '"config"': lambda v: v == 'config', '"eval"': lambda v: v == 'eval', '"probe.py"': lambda v: v == 'probe.py'}
NUMBER, STEP = 'a finite number', 'a step (a whole number >= 0)'
TIMING = {'job_s': 'a number >= 0', 'cold': 'true or false', 'init': 'true or false', 'resumed?': 'true or false',
          **{k + '?': 'a number >= 0' for k in ('fixed', 'end')}, 'tokens_per_s?': 'a number > 0',
          'ms_per_step?': 'a number >= 0'}  # study_small's measure of a pre-training job (its time model reads it)
RECORD_HEAD = {'type': '"config"', 'config': 'an object', 'unigram_loss': NUMBER,  # a pre-training record's line 1
               'run_id?': 'a string or null', 'command?': 'a string', 'commit?': 'a string or null',
               'gpu?': 'a string', 'data?': 'a string or null', 'threads?': 'a whole number >= 1', 'timing?': TIMING}
NAMED = {'pretrained?': {'run_id?': 'a string or null'}}  # the model fine-tuned (finetune_glue.py: model_id)
EVAL = {'type': '"eval"', 'step': STEP, 'loss': NUMBER, 'accuracy': 'a fraction in [0, 1]',  # each line after it
        'attn_entropy?': [NUMBER]}
RUNNER = {'gpu?': 'a string', 'job_s?': 'a number >= 0'}  # what the third study's runner adds to a job's record
GLUE_RECORD = {'request': {'*': 'a string'}, 'protocol?': NAMED, **RUNNER,
               'runs': {'*': {'*': {'dev': {'*': {'score': NUMBER}}, 'seconds?': 'a number >= 0'}}}}
BENCHMARK_RECORD = {'request': {'*': 'a string'}, 'step_95': 'a step or null', 'final_score': NUMBER,
                    'records': [{'step': STEP, 'score': NUMBER, 'numbers': {'*': NUMBER}} | NAMED]}
DIVERGED_RECORD = {'message': 'a string', 'command?': 'a string', 'gpu?': 'a string'}  # study_small's pilot
SCORE, PERCENT = 'a score in [-100, 100]', 'a percentage in [0, 100]'  # a correlation x 100; an accuracy, an F1
PROBE_RECORD = {'script': '"probe.py"', 'stsb_cosine': SCORE, 'sst2_logreg': PERCENT, 'stsb_jaccard': SCORE,
                'mrpc_majority': {'score': PERCENT}, 'rte_majority': {'accuracy': PERCENT}, **RUNNER,
                'model?': 'a string', 'step?': STEP}  # probe.py's result
STEP_TIMES = {'ms_per_step': {'*': 'a number > 0'}}  # bench.py --json
BASE_CONFIG = {k: 'a whole number >= 1' for k in ('max_iters', 'block_size', 'batch_size', 'eval_iters',
                                                  'eval_interval')} | {'dataset': 'a string'}


def misfit(value, spec, field=()):
    """(the field, as a tuple of keys, and what is wrong with it) for the first part of value that does not fit spec;
    None if it all does."""
    if isinstance(spec, str):
        return None if KINDS[spec](value) else (field, f"must be {spec}, got {json.dumps(value, default=repr)[:40]}")
    if isinstance(spec, list):
        if not isinstance(value, list) or not value:
            return field, f"must be a list of at least one entry, got {json.dumps(value, default=repr)[:40]}"
        return next((m for i, v in enumerate(value) if (m := misfit(v, spec[0], field + (i,)))), None)
    if not isinstance(value, dict):
        return field, f"must be an object, got {json.dumps(value, default=repr)[:40]}"
    for key, sub in spec.items():
        name = key.rstrip('?')
        if key == '*' and not value:
            return field, "must hold at least one entry"
        if key != '*' and name not in value:
            if key.endswith('?'):
                continue
            return field + (name,), "is missing"
        for k, v in (value.items() if key == '*' else [(name, value[name])]):
            if m := misfit(v, sub, field + (k,)):
                return m
    return None


def json_line(text, obj, field):
    """The line of field in the JSON text of obj, when the file is laid out as files.write_json lays it out (where a
    missing field would be: the end of its object); None otherwise."""
    if text.rstrip('\n') != json.dumps(obj, indent=1):
        return None
    marked, mark = copy.deepcopy(obj), '\x00here\x00'
    parent = marked
    for k in field[:-1]:
        parent = parent[k]
    if not field or isinstance(parent, list) and field[-1] >= len(parent):
        return None
    parent[field[-1]] = mark
    dumped = json.dumps(marked, indent=1)
    return dumped[:dumped.index(json.dumps(mark))].count('\n') + 1


def read_checked(path, spec, who):
    """A study's JSON file (a GLUE or benchmark record, step times) or a train.py config file (.py) at path, checked
    against spec: a missing, mistyped or non-finite field a study reads is one line naming the file, the line and the
    field, never a traceback later."""
    if path.endswith('.py'):
        obj, line = read_file(path), None
        try:
            with open(path, errors='replace') as f:
                text = f.read()
        except OSError:
            text = ''
    else:
        try:
            with open(path, 'rb') as f:
                text = f.read().decode()
            obj = json.loads(text)
        except (OSError, ValueError) as e:  # a bad byte (UnicodeDecodeError) is a ValueError
            raise SystemExit(f"{who}: {path} is not a whole study record ({oneline(e)}): restore it (git checkout "
                             f"{path}) or move it away and run again")
    if m := misfit(obj, spec):
        field, what = m
        if path.endswith('.py'):
            at = re.search(rf"^\s*{re.escape(str(field[0]))}\s*=", text, re.M) if field else None
            line = at and text.count('\n', 0, at.start()) + 1
            fix = f"set it in {path}"
        else:
            line = json_line(text, obj, field)
            fix = f"restore it (git checkout {path}) or move it away and run again"
        raise SystemExit(f"{who}: {path}" + (f", line {line}" if line else "") + ": " +
                         ('.'.join(map(str, field)) or 'the file') + f" {what}: {fix}")
    return obj


# ----------------------------------------------------------------------------- records
def read_record(path, who='study'):
    """(head, eval records sorted by step) of a committed pre-training record, head holding the run's config and U;
    None if there is none. A damaged one, or one whose line lacks what a study reads (RECORD_HEAD, EVAL), stops the
    script `who` with one line naming the file, the line and the field."""
    if not os.path.exists(path):
        return None
    try:  # every line whole: a record is written at once (atomic_write), so a cut or damaged one is never read
        with open(path, 'rb') as f:
            lines = f.read().split(b'\n')
        if lines[-1]:
            raise ValueError("its last line is cut")
        records = [json.loads(line) for line in lines[:-1]]
        if len(records) < 2:
            raise ValueError("it holds no eval records")
    except (OSError, ValueError) as e:  # a bad byte (UnicodeDecodeError) is a ValueError
        raise SystemExit(f"{who}: {path} is not a whole study record ({oneline(e)}): restore it (git checkout "
                         f"{path}) or move it away and run again")
    for n, (r, spec) in enumerate(zip(records, [RECORD_HEAD] + [EVAL] * (len(records) - 1)), 1):
        if m := misfit(r, spec):
            raise SystemExit(f"{who}: {path}, line {n}: {'.'.join(map(str, m[0])) or 'the line'} {m[1]}: restore "
                             f"it (git checkout {path}) or move it away and run again")
    evals = sorted(records[1:], key=lambda r: r['step'])
    if (twice := next((a['step'] for a, b in zip(evals, evals[1:]) if a['step'] == b['step']), None)) is not None:
        raise SystemExit(f"{who}: {path} holds step {twice} twice (which is the run's?): restore it (git checkout "
                         f"{path}) or move it away and run again")
    return records[0], evals


def write_record(path, run, command, u, extra=None):
    """The run's settings and its eval records (from out_dir/log.jsonl) as the committed record, the caller's `extra`
    facts in its first line: written once, whole."""
    ck = load_checkpoint(os.path.join(run, 'ckpt.pt'))
    settings = ck['config']
    head = {'type': 'config', 'config': settings, 'run_id': ck.get('run_id'), 'unigram_loss': u, 'command': command,
            'torch': torch.__version__, 'machine': f"{platform.machine()}, {os.cpu_count()} cores", 'cpu': cpu_name(),
            'commit': code_commit(), 'date': datetime.date.today().isoformat(), **(extra or {})}
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


CLONE_MADE = 'study-clone-made'  # in a clone's .git/: written once its checkout is complete


def clone_at(sha, dest, who):
    """dest, a clone of this repository checked out at commit sha: made whole, or made again. Its marker
    (.git/CLONE_MADE) is written once the checkout is complete, so a clone cut by a Ctrl-C while it was made (its
    HEAD may be sha already) is removed and made again; a folder there that is no clone of this repository, or a
    clone since moved to another commit, is refused and left as it is (it may be the user's)."""
    git = lambda *a: subprocess.run(['git', *a], capture_output=True, text=True)
    at = lambda *a: git('--git-dir', os.path.join(dest, '.git'), *a)  # never a repository above dest (-C would)
    marker = os.path.join(dest, '.git', CLONE_MADE)
    if os.path.isfile(marker) and at('rev-parse', 'HEAD').stdout.strip() == sha:
        return
    if os.path.lexists(dest):
        origin = at('config', '--get', 'remote.origin.url').stdout.strip()
        if os.path.isfile(marker) or not origin or os.path.realpath(origin) != os.path.realpath(ROOT):
            raise SystemExit(f"{who}: {dest} is there but is no clone of {sha[:12]}: move it away (it is not "
                             "removed: it may be yours)")
        print(f"{who}: {dest} was cut while it was made: made again", flush=True)
        try:
            shutil.rmtree(dest)
        except OSError as e:
            raise SystemExit(f"{who}: cannot remove the unfinished clone {dest} ({oneline(e)}): remove it by hand")
    made = git('clone', '--quiet', '--shared', '--no-checkout', ROOT, dest)
    made = made.returncode and made or git('-C', dest, 'checkout', '--quiet', '--detach', sha)
    if made.returncode:
        raise SystemExit(f"{who}: cannot clone commit {sha} into {dest}: {oneline(made.stderr)}")
    atomic_write(marker, lambda f: f.write(sha + '\n'), mode='w')  # last: the clone is whole


def same_request(request, cmd):
    """Whether a fine-tune record's request ({key: value}) is the job's settings cmd (--key=value), its lists (tasks,
    seeds) compared as sets: the order they were given in makes no other job."""
    norm = lambda a: re.sub(r'^(--(?:tasks|seeds)=)(.*)$', lambda m: m[1] + ','.join(sorted(m[2].split(','))), a)
    return sorted(norm(f'--{k}={v}') for k, v in request.items()) == sorted(map(norm, cmd))


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
