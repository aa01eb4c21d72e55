"""Issue 53's artifact bullet: the payload carries a SHA-256 (an old format asks to be recompiled), every field of the
payload is required (an edited artifact with its digest recomputed never runs with a default in place of a field it
lacks), and the artifact records the SHA-256 of the weights it was compiled or verified with, which `run` checks."""

from __future__ import annotations

import json
import struct
import zlib

import msgpack
import numpy as np
import pytest
import torch
from conftest import export_ir
from safetensors.numpy import save_file

import npu_compiler
from npu_compiler.digest import weights_digest
from npu_compiler.errors import ArtifactError
from npu_compiler.program import FORMAT_VERSION, MAGIC, CompiledProgram, pack_payload
from npusim.cli import main


class _AllKinds(torch.nn.Module):
    """A conv with a bias epilogue, a GEMM, generated kernels and an attention: a kernel record of every kind."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = torch.relu(self.conv(x)).reshape(1, 4, 16)
        q = self.fc(h)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q) * 2.0


@pytest.fixture(scope="module")
def program() -> CompiledProgram:
    ir = export_ir(_AllKinds, [torch.randn(1, 2, 4, 4)], "kinds")
    prog = npu_compiler.compile(ir, "cpu", dtype="float32")
    assert {k.kind for k in prog.kernels} == {"conv2d", "gemm", "generated", "attention"}, \
        sorted({k.kind for k in prog.kernels})
    return prog


OPAQUE = {"config", "stats"}  # informational mappings: nothing that runs reads them


def _key_paths(d, path=()):
    """Every key of every mapping in the payload, one path per distinct shape of path (list indices as '*'), with
    the concrete path to delete."""
    seen = {}
    stack = [(d, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                q = (*p, k)
                pattern = tuple("*" if isinstance(i, int) else i for i in q)
                kind_ = _kernel_kind(d, q)
                seen.setdefault((kind_, pattern), q)
                if not (len(p) == 0 and k in OPAQUE):
                    stack.append((x, q))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                if isinstance(x, dict | list):
                    stack.append((x, (*p, i)))
    return sorted(seen.values(), key=str)


def _kernel_kind(d, path):
    if len(path) >= 2 and path[0] == "kernels":
        return d["kernels"][path[1]]["kind"]
    return ""


def _without(d, path):
    d = msgpack.unpackb(msgpack.packb(d, use_bin_type=True), raw=False, strict_map_key=False)  # a deep copy
    node = d
    for k in path[:-1]:
        node = node[k]
    del node[path[-1]]
    return d


def test_every_field_of_the_payload_is_required(program):
    """Each key of the payload deleted in turn (one of each kind of path: every field of every kernel kind's record,
    of every spec, recipe, buffer and view), the digest recomputed as anyone can: each is refused, naming it."""
    d = program.to_dict()
    paths = _key_paths(d)
    assert len(paths) > 80, len(paths)
    accepted = []
    for path in paths:
        blob = pack_payload(msgpack.packb(_without(d, path), use_bin_type=True))
        try:
            CompiledProgram.from_bytes(blob)
        except ArtifactError as e:
            assert "missing" in str(e) or "needs" in str(e) or "takes exactly" in str(e), (path, str(e))
        else:
            accepted.append(".".join(map(str, path)))
    assert not accepted, f"read with a default in place of: {accepted}"


def test_every_field_of_a_partitioned_artifact_is_required():
    """The same for a partitioned artifact (target programs, CPU reference programs, a torch_ir segment): each key
    of its own fields and of one segment of each runner deleted in turn is refused. (The programs inside are read by
    the plain program reader, whose every key the test above deletes; the torch_ir segment's IR by the IR reader:
    tests/test_ir_fields.py.)"""
    import partitioned_cases as pc

    from npu_compiler.partitioned_program import artifact_from_bytes

    _, ir, _, _ = pc.make()
    d = pc.artifact(ir, "cpu").to_dict()
    runners = {}
    for i, seg in enumerate(d["segments"]):
        runners.setdefault(seg["runner"], i)
    assert len(runners) == 3, runners
    paths = [(k,) for k in d if k not in OPAQUE] + \
        [(key, 0, k) for key in ("inputs", "outputs", "fallback") for k in d[key][0]] + \
        [("segments", i, k) for i in runners.values() for k in d["segments"][i] if k not in ("program", "ir")] + \
        [("segments", i, key, 0, k) for i in runners.values() for key in ("inputs", "outputs")
         for k in d["segments"][i][key][0]]
    accepted = []
    for path in paths:
        blob = pack_payload(msgpack.packb(_without(d, path), use_bin_type=True))
        try:
            artifact_from_bytes(blob)
        except ArtifactError:
            pass
        else:
            accepted.append(".".join(map(str, path)))
    assert not accepted, f"read with a default in place of: {accepted}"


def test_an_acc_node_always_names_its_group(program):
    d = program.to_dict()
    conv = next(k for k in d["kernels"] if k["kind"] == "conv2d")
    assert conv["spec"]["epilogue"] is not None

    def accs(e):
        if isinstance(e, list) and e and e[0] == "acc":
            yield e
        elif isinstance(e, list):
            for x in e:
                yield from accs(x)

    for a in accs(conv["spec"]["epilogue"]):
        assert len(a) == 3
        del a[2]
    with pytest.raises(ArtifactError, match="'acc' has 2 fields, expected 3"):
        CompiledProgram.from_bytes(pack_payload(msgpack.packb(d, use_bin_type=True)))


def test_the_payload_digest_is_sha256(program):
    blob = bytearray(program.to_bytes())
    assert blob[:8] == MAGIC and struct.unpack_from("<I", blob, 8)[0] == FORMAT_VERSION
    import hashlib

    assert bytes(blob[20:52]) == hashlib.sha256(bytes(blob[52:])).digest()
    blob[-5] ^= 0x40
    with pytest.raises(ArtifactError, match="SHA-256"):
        CompiledProgram.from_bytes(bytes(blob))


def test_a_format_2_artifact_asks_to_be_recompiled(program, tmp_path, capsys):
    payload = msgpack.packb({**program.to_dict(), "format_version": 2}, use_bin_type=True)
    old = struct.pack("<8sIQI", MAGIC, 2, len(payload), zlib.crc32(payload)) + payload
    (tmp_path / "old.npubin").write_bytes(old)
    with pytest.raises(ArtifactError, match=rf"format version 2, this build reads version {FORMAT_VERSION} "
                                            r"\(written by an older npusim.*recompile it "
                                            r".*npusim compile IR.json -o X.npubin"):
        CompiledProgram.load(tmp_path / "old.npubin")
    assert main(["describe", str(tmp_path / "old.npubin")]) == 1
    assert "recompile it" in capsys.readouterr().err


# ---- the weights' SHA-256 -----------------------------------------------------------------------------------------


def _export(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Linear(6, 4)
    ir = export_ir(lambda: torch.nn.Linear(6, 4), [torch.randn(2, 6)], "lin")
    (tmp_path / "lin.json").write_text(json.dumps(ir))
    save_file({k: v.numpy() for k, v in m.state_dict().items()}, str(tmp_path / "lin.safetensors"))
    other = {k: v.numpy() + 1 for k, v in m.state_dict().items()}
    save_file(other, str(tmp_path / "other.safetensors"))
    return tmp_path / "lin.json", tmp_path / "lin.safetensors", tmp_path / "other.safetensors"


def test_run_says_when_the_weights_are_not_the_compiled_ones(tmp_path, capsys):
    ir, w, other = _export(tmp_path)
    art = tmp_path / "lin.npubin"
    assert main(["compile", str(ir), "-o", str(art), "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"weights: {w} (sha256 {weights_digest(w)[:12]}" in out  # found beside the IR
    assert CompiledProgram.load(art).weights_sha256 == weights_digest(w)
    assert main(["run", str(art), "--iters", "1", "--warmup", "0"]) == 0  # the weights beside it, said so
    err = capsys.readouterr().err
    assert f"weights: {w} (beside {art}" in err and "not the ones" not in err
    assert main(["run", str(art), "--weights", str(other), "--iters", "1", "--warmup", "0"]) == 0
    err = capsys.readouterr().err
    assert f"weights {other} are not the ones the artifact was compiled or verified with (sha256 " \
           f"{weights_digest(other)[:12]} given, {weights_digest(w)[:12]} recorded)" in err


def test_verify_writes_the_verified_program_with_its_weights_digest(tmp_path, capsys):
    ir, w, other = _export(tmp_path)
    out = tmp_path / "verified.npubin"
    assert main(["verify", str(ir), "--weights", str(other), "-o", str(out)]) == 0
    assert "verified program written" in capsys.readouterr().out
    assert CompiledProgram.load(out).weights_sha256 == weights_digest(other)


def test_no_weights_given_or_beside_names_both_ways(tmp_path, capsys):
    ir, w, _ = _export(tmp_path)
    w.unlink()
    assert main(["compile", str(ir), "-o", str(tmp_path / "lin.npubin"), "--target", "cpu"]) == 0
    assert CompiledProgram.load(tmp_path / "lin.npubin").weights_sha256 is None
    assert main(["run", str(tmp_path / "lin.npubin")]) == 2
    err = capsys.readouterr().err
    assert "--weights FILE.safetensors" in err and f"no {tmp_path / 'lin'}.safetensors beside" in err


def test_a_folder_digest_covers_every_shard(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    save_file({"a": np.zeros(3, np.float32)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"b": np.ones(3, np.float32)}, str(d / "model-00002-of-00002.safetensors"))
    first = weights_digest(d)
    save_file({"b": np.full(3, 2, np.float32)}, str(d / "model-00002-of-00002.safetensors"))
    assert weights_digest(d) != first
    (d / "model-00002-of-00002.safetensors").rename(d / "renamed.safetensors")
    assert len({first, weights_digest(d)}) == 2
