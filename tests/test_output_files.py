"""What npusim writes goes only to regular files or new paths, never over the command's own inputs, and leaves no
temporary behind: the attacks of issue 53 (`-o` at a FIFO, a symlink, a device; `compile m.json -o m.json`; a
SIGTERM or SIGKILL during the write), for every command that writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_hardening import small_ir, small_weights, write_safetensors

import npu_compiler
from npu_compiler import atomic
from npu_compiler.errors import OutputError
from npusim.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> dict[str, Path]:
    import json

    d = tmp_path_factory.mktemp("outputs")
    (d / "m.json").write_text(json.dumps(small_ir()))
    npu_compiler.compile(small_ir()).save(d / "m.npubin")
    write_safetensors(d / "w.safetensors", {k: ("F32", v.shape, v.tobytes()) for k, v in small_weights().items()})
    return {"ir": d / "m.json", "artifact": d / "m.npubin", "weights": d / "w.safetensors"}


def _hostile(tmp_path: Path, kind: str, victim: Path) -> Path:
    """A path of `kind` in tmp_path: a FIFO, a symlink to `victim`, or a hard link to it."""
    p = tmp_path / f"{kind}.out"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "symlink":
        p.symlink_to(victim)
    elif kind == "hardlink":
        os.link(victim, p)
    return p


def _untouched(p: Path, before: os.stat_result) -> None:
    after = os.lstat(p)
    assert (after.st_ino, after.st_mode, after.st_size, after.st_mtime_ns) == \
        (before.st_ino, before.st_mode, before.st_size, before.st_mtime_ns)


# Every command that writes a file, with the option that names it ({out}) and its inputs.
WRITERS = {
    "compile": ["compile", "{ir}", "-o", "{out}"],
    "run -o": ["run", "{artifact}", "--weights", "{weights}", "--iters", "1", "--warmup", "0", "-o", "{out}"],
    "profile --trace": ["profile", "{artifact}", "--weights", "{weights}", "--iters", "1", "--warmup", "0",
                        "--trace", "{out}"],
    "profile --chart": ["profile", "{artifact}", "--weights", "{weights}", "--iters", "1", "--warmup", "0",
                        "--chart", "{out}"],
    "estimate --trace": ["estimate", "{artifact}", "--npu", "edge-4tops", "--trace", "{out}"],
}


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
@pytest.mark.parametrize("command", list(WRITERS))
def test_an_output_that_is_not_a_regular_file_is_refused(model, tmp_path, capsys, command, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = _hostile(tmp_path, kind, victim)
    before = os.lstat(out)
    argv = [a.format(out=out, **model) for a in WRITERS[command]]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert ("FIFO" if kind == "fifo" else "symbolic link") in err and "regular files or new paths" in err, err
    _untouched(out, before)
    assert victim.read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if atomic.TEMP_MARK in p.name]


@pytest.mark.parametrize("command,victim", [("compile", "ir"), ("run -o", "weights"), ("run -o", "artifact"),
                                            ("profile --trace", "artifact"), ("estimate --trace", "artifact")])
def test_an_output_over_the_commands_own_input_is_refused(model, tmp_path, capsys, command, victim):
    """`npusim compile m.json -o m.json`, and the same through a hard link (another name for the same file)."""
    for out in (model[victim], _hostile(tmp_path, "hardlink", model[victim])):
        before = os.lstat(model[victim])
        argv = [a.format(out=out, **model) for a in WRITERS[command]]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "it is an input of this command" in err, err
        _untouched(model[victim], before)


def test_a_character_device_is_refused(monkeypatch, model, capsys):
    """`-o /dev/null`: as root, replacing it would replace the system's. (os.replace is disarmed for the test, so a
    regression fails here instead of replacing /dev/null.)"""
    real_replace = os.replace

    def guarded(src, dst, *a, **k):
        assert os.fspath(dst) != "/dev/null", "npusim tried to replace /dev/null"
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", guarded)
    with pytest.raises(OutputError, match="character device"):
        atomic.check_target("/dev/null")
    assert main(["compile", str(model["ir"]), "-o", "/dev/null"]) == 1
    assert "character device" in capsys.readouterr().err
    assert Path("/dev/null").is_char_device()


def test_folder_outputs_refuse_what_they_would_clobber(model, tmp_path, capsys):
    """Commands that write a folder of files (verify --dump-repro, export, export-llm, demo) check each file."""
    repro = tmp_path / "repro"
    repro.mkdir()
    os.mkfifo(repro / "kernel.npubin")
    assert main(["verify", str(model["ir"]), "--weights", str(model["weights"]), "--dump-repro", str(repro),
                 "--atol", "0", "--rtol", "0", "--max-rel", "0", "--min-pearson", "2"]) == 1
    assert "FIFO" in capsys.readouterr().err
    out = tmp_path / "exp"
    out.mkdir()
    (out / "resnet18.json").symlink_to(model["ir"])
    assert main(["export", "resnet18", "--width", "8", "--image-size", "32", "--num-classes", "10", "-o",
                 str(out)]) == 1
    assert "symbolic link" in capsys.readouterr().err
    assert (out / "resnet18.json").is_symlink()
    llm = tmp_path / "llm"
    llm.mkdir()
    os.mkfifo(llm / "prefill.json")
    assert main(["export-llm", "--config", "tiny", "-o", str(llm), "--max-cache-len", "16", "--prefill-len", "4"]) == 1
    assert "FIFO" in capsys.readouterr().err


def test_an_export_never_overwrites_its_checkpoint(tmp_path, capsys):
    """`npusim export tiny.py:tiny --checkpoint out/tiny.safetensors -o out`: the checkpoint is the file the export
    would write its weights to."""
    import torch
    from safetensors.torch import save_file

    (tmp_path / "tiny.py").write_text("import torch\ndef tiny():\n    return torch.nn.Linear(4, 3)\n")
    out = tmp_path / "out"
    out.mkdir()
    ckpt = out / "tiny.safetensors"
    save_file(torch.nn.Linear(4, 3).state_dict(), str(ckpt))
    before = os.lstat(ckpt)
    assert main(["export", f"{tmp_path / 'tiny.py'}:tiny", "--input-shape", "2,4", "--checkpoint", str(ckpt), "-o",
                 str(out)]) == 1
    assert "it is an input of this command" in capsys.readouterr().err
    _untouched(ckpt, before)


# ---- temporaries on signals ---------------------------------------------------------------------------------------

# A real `npusim compile` whose write stops in the middle (fsync sleeps), so a signal arrives with the temporary on
# disk, holding part of the file.
SLOW_COMPILE = textwrap.dedent("""
    import os, sys, time
    real = os.fsync
    def slow(fd):
        print("writing", flush=True)
        time.sleep(60)
    os.fsync = slow
    from npusim.cli import main
    sys.exit(main(["compile", sys.argv[1], "-o", sys.argv[2]]))
""")


def _start_slow_compile(model, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_COMPILE, str(model["ir"]), str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing", proc.stderr.read()
    return proc


def _temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if atomic.TEMP_MARK in p.name]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_write_removes_the_temporary(model, tmp_path, sig):
    out = tmp_path / "m.npubin"
    proc = _start_slow_compile(model, out)
    assert len(_temporaries(tmp_path)) == 1
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert proc.returncode == (128 + sig if sig == signal.SIGTERM else 130)
    assert not _temporaries(tmp_path) and not out.exists()


def test_the_next_write_sweeps_what_a_sigkill_left(model, tmp_path, capsys):
    out = tmp_path / "m.npubin"
    proc = _start_slow_compile(model, out)
    proc.kill()
    proc.wait(timeout=30)
    left = _temporaries(tmp_path)
    assert len(left) == 1 and not out.exists()  # SIGKILL cannot be caught
    other = tmp_path / f".other.npubin{atomic.TEMP_MARK}1-x.tmp.npubin"  # another output's: not touched
    other.write_bytes(b"x")
    assert main(["compile", str(model["ir"]), "-o", str(out)]) == 0
    assert out.is_file() and _temporaries(tmp_path) == [other]


def test_a_live_writers_temporary_is_left_alone(tmp_path):
    """Two writes of one output at once: the second does not remove the first's temporary (its process runs)."""
    target = tmp_path / "x.bin"
    mine = tmp_path / f".x.bin{atomic.TEMP_MARK}{os.getpid()}-abc.tmp.bin"
    mine.write_bytes(b"in progress")
    atomic.write_bytes(target, b"done")
    assert mine.exists() and target.read_bytes() == b"done"


def test_temporaries_are_swept_only_when_their_process_is_gone(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    time.sleep(0.05)
    stale = tmp_path / f".x.bin{atomic.TEMP_MARK}{dead.pid}-abc.tmp.bin"
    stale.write_bytes(b"half")
    assert atomic.sweep_stale(tmp_path / "x.bin") == [stale]
