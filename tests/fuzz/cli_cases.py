"""CLI cases: one command line each, with one option or input file varied, and whether the documentation accepts
it ("valid") or refuses it ("invalid"). Placeholders in the argv name the seeds and files the worker makes:
{ART} {IR} {W} (the small ResNet's artifact, IR and weights), {ART_Q} {WQ} (the tiny Qwen2 decode program and its
weights), {LLM} (an `export-llm` folder), {OUT} (an empty folder), {MISSING} (a folder that does not exist),
{DIR} (an existing folder), {FIFO} and {LINK} (a FIFO and a symlink, outputs npusim must refuse), {NPY:kind} and
{NPZ:kind} (array files made per case), {FILE:kind} (other files)."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
from pathlib import Path

import numpy as np

X_SHAPE = (1, 3, 32, 32)  # the ResNet seed's input "x"
NPY_VALID = ["ok", "fortran", "bigendian", "nan"]
NPY_INVALID = ["complex", "object", "pickle", "npz", "shape", "f64", "int", "zero_d", "huge_header", "truncated",
               "structured", "str", "empty", "bool", "text"]


def _v(argv: list[str], expect: str, why: str = "") -> dict:
    return {"kind": "cli", "argv": argv, "expect": expect, "why": why}


def _pick(r: random.Random, valid: list[str], invalid: list[str]) -> tuple[str, str]:
    if r.random() < 0.4:
        return r.choice(valid), "valid"
    return r.choice(invalid), "invalid"


RUN = ["run", "{ART}", "--weights", "{W}", "--iters", "1", "--warmup", "0", "--backend", "cpu"]


def _run(r: random.Random) -> dict:
    c = r.choice(["input", "input_spec", "out", "iters", "warmup", "topk", "seed", "backend", "weights", "model",
                  "json", "force"])
    if c == "input":
        kind, e = _pick(r, NPY_VALID, NPY_INVALID)
        return _v(RUN + ["--input", f"x={{NPY:{kind}}}"], e, f"input file {kind}")
    if c == "input_spec":
        spec, e = _pick(r, ["x={NPY:ok}"], ["x", "=a.npy", "x=", "y={NPY:ok}", "x={MISSING}/a.npy", "x={DIR}"])
        argv = RUN + ["--input", spec]
        if e == "valid" and r.random() < 0.3:
            argv += ["--input", spec]
            e = "invalid"  # the same input twice
        return _v(argv, e, f"--input {spec}")
    if c == "out":
        v, e = _pick(r, ["{OUT}/o.npz"], ["{MISSING}/o.npz", "{DIR}", "", "{FIFO}", "{LINK}", "{W}"])
        return _v(RUN + ["-o", v], e, f"-o {v}")
    if c == "iters":
        v, e = _pick(r, ["1", "2", "3"], ["0", "-1", "1000001", "x", "1.5", "", "nan"])
        return _v(RUN[:4] + ["--iters", v, "--warmup", "0", "--backend", "cpu"], e, f"--iters {v}")
    if c == "warmup":
        v, e = _pick(r, ["0", "1"], ["-1", "1000001", "nan", "1e3"])
        return _v(RUN[:4] + ["--iters", "1", "--warmup", v, "--backend", "cpu"], e, f"--warmup {v}")
    if c == "topk":
        v, e = _pick(r, ["0", "1", "5", "1000"], ["-3", "-1", "x", "2.5"])
        return _v(RUN + ["--top-k", v], e, f"--top-k {v}")
    if c == "seed":
        v, e = _pick(r, ["0", "7", str(2**63 - 1)], ["-1", str(2**63), "x", "1e3"])
        return _v(RUN + ["--seed", v], e, f"--seed {v}")
    if c == "backend":
        v, e = _pick(r, ["cpu"], ["bogus", "", "cuda:0"])
        return _v(RUN[:-1] + [v], e, f"--backend {v}")
    if c == "weights":
        v, e = _pick(r, ["{W}"], ["{MISSING}/w.safetensors", "{DIR}", "{FILE:garbage}", "{FILE:empty}", "{WQ}"])
        return _v(["run", "{ART}", "--weights", v, "--iters", "1", "--warmup", "0"], e, f"--weights {v}")
    if c == "model":
        v, e = _pick(r, ["{ART}", "{IR}"], ["{MISSING}/m.npubin", "{DIR}", "{FILE:empty}", "{FILE:garbage}", "{W}",
                                            "{FILE:ir_garbage}"])
        return _v(["run", v, "--weights", "{W}", "--iters", "1", "--warmup", "0"], e, f"model {v}")
    if c == "json":
        return _v(RUN + ["--json"], "valid")
    return _v(RUN + ["--force-cpu", "relu_"], "invalid", "--force-cpu with an artifact")


def _describe(r: random.Random) -> dict:
    c = r.choice(["plain", "graph", "source", "both", "model"])
    if c == "plain":
        return _v(["describe", "{ART}"] + r.choice([[], ["--json"]]), "valid")
    if c == "graph":
        v, e = _pick(r, ["dot", "mermaid"], ["svg", "", "DOT"])
        return _v(["describe", "{ART}", "--graph", v], e, f"--graph {v}")
    if c == "source":
        v, e = _pick(r, ["0", "3", "k0_conv2d", "{KERNEL_NAME}"], ["-1", "99999", "x", "", "1.0"])
        return _v(["describe", "{ART}", "--source", v], e if v != "k0_conv2d" else "maybe", f"--source {v}")
    if c == "both":
        return _v(["describe", "{ART}", "--graph", "dot", "--json"], "invalid", "--graph with --json")
    v, e = _pick(r, ["{ART_Q}"], ["{MISSING}/m.npubin", "{FILE:garbage}", "{IR}", "{FILE:empty}"])
    return _v(["describe", v], e, f"model {v}")


def _compile(r: random.Random) -> dict:
    base = ["compile", "{IR}", "-o", "{OUT}/m.npubin"]
    c = r.choice(["out", "dtype", "target", "rope", "pass", "ir", "nofusion"])
    if c == "out":
        v, e = _pick(r, ["{OUT}/m.npubin", "{OUT}/m"], ["{MISSING}/m.npubin", "{DIR}", "", "{FIFO}", "{LINK}", "{IR}"])
        return _v(["compile", "{IR}", "-o", v], e, f"-o {v}")
    if c == "dtype":
        v, e = _pick(r, ["auto", "float32", "float16", "bfloat16"], ["int8", "fp16", "", "float64"])
        return _v(base + ["--dtype", v], e, f"--dtype {v}")
    if c == "target":
        v, e = _pick(r, ["cpu", "cuda"], ["bogus", "", "webgpu2"])
        return _v(base + ["--target", v], e, f"--target {v}")
    if c == "rope":
        v, e = _pick(r, ["10000", "1e6", "0.5"], ["nan", "-1", "0", "inf", "x", "-inf"])
        return _v(base + ["--rope-theta", v], e, f"--rope-theta {v}")
    if c == "pass":
        v, e = _pick(r, ["bn_fold", "conv_epilogue", "elementwise_fusion"], ["nope", "", "BN_FOLD"])
        return _v(base + ["--disable-pass", v], e, f"--disable-pass {v}")
    if c == "ir":
        v, e = _pick(r, ["{IR}"], ["{MISSING}/m.json", "{DIR}", "{FILE:empty}", "{FILE:garbage}", "{ART}",
                                   "{FILE:ir_garbage}", "{FILE:ir_deep}", "{FILE:ir_bigint}"])
        return _v(["compile", v, "-o", "{OUT}/m.npubin"], e, f"IR {v}")
    return _v(base + ["--no-fusion"], "valid")


PROFILE = ["profile", "{ART}", "--weights", "{W}", "--iters", "1", "--warmup", "0", "--backend", "cpu"]


def _profile(r: random.Random) -> dict:
    c = r.choice(["top", "trace", "chart", "json"])
    if c == "top":
        v, e = _pick(r, ["0", "3"], ["-1", "x", "nan"])
        return _v(PROFILE + ["--top", v], e, f"--top {v}")
    if c == "trace":
        v, e = _pick(r, ["{OUT}/t.json"], ["{MISSING}/t.json", "{DIR}", "{FIFO}", "{LINK}", "{ART}"])
        return _v(PROFILE + ["--trace", v], e, f"--trace {v}")
    if c == "chart":
        v, e = _pick(r, ["{OUT}/c.png"], ["{MISSING}/c.png", "{DIR}", "{FIFO}", "{LINK}"])
        return _v(PROFILE + ["--chart", v], e, f"--chart {v}")
    return _v(PROFILE + ["--json"], "valid")


def _partition(r: random.Random) -> dict:
    c = r.choice(["target", "force", "json"])
    if c == "target":
        v, e = _pick(r, ["cpu", "cuda"], ["bogus", ""])
        return _v(["partition", "{IR}", "--target", v], e, f"--target {v}")
    if c == "force":
        v, e = _pick(r, ["relu_", "aten.add_.Tensor", "conv2d"], ["cumsum", "", "nope_node", ","])
        return _v(["partition", "{IR}", "--force-cpu", v], e, f"--force-cpu {v}")
    return _v(["partition", "{IR}", "--json"], "valid")


VERIFY = ["verify", "{IR}", "--weights", "{W}", "--backend", "cpu"]


def _verify(r: random.Random) -> dict:
    c = r.choice(["atol", "rtol", "pearson", "maxrel", "expected"])
    if c in ("atol", "rtol", "maxrel"):
        flag = {"atol": "--atol", "rtol": "--rtol", "maxrel": "--max-rel"}[c]
        v, e = _pick(r, ["1", "0.5"], ["nan", "-1", "inf", "x"])
        return _v(VERIFY + [flag, v], e, f"{flag} {v}")
    if c == "pearson":
        v, e = _pick(r, ["0.5", "-1", "2"], ["nan", "x", "inf"])
        return _v(VERIFY + ["--min-pearson", v], e, f"--min-pearson {v}")
    v, e = _pick(r, ["{NPZ:golden}"], ["{NPZ:wrong_name}", "{NPZ:wrong_shape}", "{NPY:ok}", "{MISSING}/g.npz",
                                       "{FILE:garbage}", "{NPZ:object}"])
    return _v(["verify", "{ART}", "--weights", "{W}", "--backend", "cpu", "--input", "x={NPY:ok}", "--expected", v],
              e if v != "{NPZ:golden}" else "maybe", f"--expected {v}")


GENERATE = ["generate", "{LLM}", "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--backend", "cpu"]


def _generate(r: random.Random) -> dict:
    c = r.choice(["temperature", "topk", "topp", "seed", "tokens", "ids", "prompt", "stop", "chat"])
    if c == "temperature":
        v, e = _pick(r, ["0", "0.7", "2"], ["nan", "-1", "inf", "x", "-inf"])
        return _v(GENERATE + ["--temperature", v], e, f"--temperature {v}")
    if c == "topk":
        v, e = _pick(r, ["1", "5", "100000"], ["0", "-3", "x"])
        return _v(GENERATE + ["--temperature", "0.7", "--top-k", v], e, f"--top-k {v}")
    if c == "topp":
        v, e = _pick(r, ["0.9", "1"], ["0", "1.5", "nan", "-0.1"])
        return _v(GENERATE + ["--temperature", "0.7", "--top-p", v], e, f"--top-p {v}")
    if c == "seed":
        v, e = _pick(r, ["0", "5"], ["-1", str(2**63), "x"])
        return _v(GENERATE + ["--temperature", "0.7", "--seed", v], e, f"--seed {v}")
    if c == "tokens":
        v, e = _pick(r, ["1", "3"], ["0", "-1", "1000000000", "x"])
        return _v(["generate", "{LLM}", "--prompt-ids", "1,2", "--max-new-tokens", v, "--backend", "cpu"], e,
                  f"--max-new-tokens {v}")
    if c == "ids":
        v, e = _pick(r, ["1,2,3", "5", "1,,2"], ["", "1,x", "-5", "999999", "1.5", str(2**70)])
        return _v(["generate", "{LLM}", "--prompt-ids", v, "--max-new-tokens", "2", "--backend", "cpu"], e,
                  f"--prompt-ids {v}")
    if c == "prompt":
        v, e = _pick(r, ["hi", "a b c", "\x1b[2J"], [""])
        return _v(["generate", "{LLM}", "--prompt", v, "--max-new-tokens", "2", "--backend", "cpu"], e,
                  f"--prompt {v!r}")
    if c == "stop":
        v, e = _pick(r, ["", "1", "1,2"], ["x", "1,y"])
        return _v(GENERATE + ["--stop-ids", v], e, f"--stop-ids {v}")
    return _v(GENERATE + ["--chat"], "invalid", "--chat with --prompt-ids")


FOLDER_DAMAGE = {
    # (file, JSON path or None for the whole text, new value or text): what a hand-edited or damaged folder holds
    "manifest_missing": ("manifest.json", None, None),
    "manifest_text": ("manifest.json", None, "{not json"),
    "manifest_list": ("manifest.json", None, "[1, 2]"),
    "manifest_deep": ("manifest.json", None, "[" * 100_000 + "]" * 100_000),
    "format": ("manifest.json", ["format"], "npusim.llm/9"),
    "files_missing": ("manifest.json", ["files", "cache_map"], "__delete__"),
    "files_escape": ("manifest.json", ["files", "prefill"], "../../../etc/passwd"),
    "files_type": ("manifest.json", ["files", "decode"], 7),
    "model_dir": ("manifest.json", ["model_dir"], "/nonexistent/model"),
    "model_dir_type": ("manifest.json", ["model_dir"], ["x"]),
    "cache_len": ("cache_map.json", ["model", "max_cache_len"], -1),
    "cache_len_type": ("cache_map.json", ["model", "max_cache_len"], "32"),
    "vocab": ("cache_map.json", ["model", "vocab_size"], 0),
    "masked": ("cache_map.json", ["attention_mask", "masked"], None),
    "layers": ("cache_map.json", ["graphs", "decode", "layers"], []),
    "layer_name": ("cache_map.json", ["graphs", "prefill", "layers", 0, "k_input"], "nope"),
    "input_name": ("cache_map.json", ["graphs", "decode", "inputs", "input_ids"], "nope"),
    "logits_name": ("cache_map.json", ["graphs", "prefill", "outputs", "logits"], 5),
    "seq_len": ("cache_map.json", ["graphs", "prefill", "seq_len"], 0),
    "cache_map_text": ("cache_map.json", None, "\x00\x01"),
    "config_type": ("config.json", ["model_type"], "llama"),
    "config_text": ("config.json", None, "{"),
    "eos": ("generation_config.json", ["eos_token_id"], "two"),
    "program": ("decode.npubin", None, "NPUBIN"),
    "weights_gone": ("model.safetensors", None, None),
}


def _generate_folder(r: random.Random) -> dict:
    kind = r.choice(sorted(FOLDER_DAMAGE))
    return _v(["generate", f"{{LLMBAD:{kind}}}", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--backend", "cpu"],
              "invalid", f"LLM folder: {kind}")


def _export(r: random.Random) -> dict:
    base = ["export", "resnet18", "--width", "4", "--image-size", "16", "--num-classes", "3", "-o", "{OUT}/exp"]
    v, e = _pick(r, ["", "--dtype float16"], ["--width 0", "--image-size -1", "--dtype int8", "--num-classes 0",
                                               "--input-shape 1,,3", "--input-shape -1,3,16,16"])
    argv = list(base)
    if v:
        flag, value = v.split(" ", 1)
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return _v(argv, e, f"export {v}")


COMMANDS = [(_run, 30), (_describe, 14), (_compile, 16), (_profile, 8), (_partition, 8), (_verify, 6),
            (_generate, 12), (_generate_folder, 6), (_export, 2)]


def make(r: random.Random, i: int) -> dict:
    fns, weights = zip(*COMMANDS)
    return r.choices(fns, weights=weights)[0](r)


# ---- materialising ----------------------------------------------------------------------------------------------


def _npy(path: Path, kind: str) -> None:
    x = np.random.default_rng(0).standard_normal(X_SHAPE).astype(np.float32)
    if kind == "ok":
        np.save(path, x)
    elif kind == "fortran":
        np.save(path, np.asfortranarray(x))
    elif kind == "bigendian":
        np.save(path, x.astype(">f4"))
    elif kind == "nan":
        x[0, 0, 0, 0] = np.nan
        np.save(path, x)
    elif kind == "complex":
        np.save(path, x.astype(np.complex64))
    elif kind == "object":
        np.save(path, np.array([x, 1], dtype=object), allow_pickle=True)
    elif kind == "pickle":
        path.write_bytes(pickle.dumps(x))
    elif kind == "npz":
        np.savez(path.with_suffix(".npz"), x=x)
        path.with_suffix(".npz").rename(path)
    elif kind == "shape":
        np.save(path, x[:, :2])
    elif kind == "f64":
        np.save(path, x.astype(np.float64))
    elif kind == "int":
        np.save(path, x.astype(np.int64))
    elif kind == "zero_d":
        np.save(path, np.float32(1.0))
    elif kind == "huge_header":
        header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"
        header += " " * (63 - (len(header) + 10) % 64) + "\n"
        path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\x00" * 16)
    elif kind == "truncated":
        np.save(path, x)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "structured":
        np.save(path, np.zeros(X_SHAPE, dtype=[("a", "<f4")]))
    elif kind == "str":
        np.save(path, np.full(X_SHAPE, "x"))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "bool":
        np.save(path, x > 0)
    elif kind == "text":
        path.write_text("1 2 3\n")
    else:
        raise ValueError(kind)


def _npz(path: Path, kind: str, ctx) -> None:
    if kind == "golden":
        import npu_runtime
        from npu_compiler.program import CompiledProgram

        prog = CompiledProgram.load(ctx.seed_dir / "resnet_f32.npubin")
        cpu = npu_runtime.get_backend("cpu")
        x = np.load(ctx.work / "x_ok.npy")
        out = cpu.create_executor(prog).run_numpy({"x": x}, npu_runtime.load_weights(prog, ctx.weights("resnet"),
                                                                                       cpu))
        np.savez(path, **out)
    elif kind == "wrong_name":
        np.savez(path, nope=np.zeros((1, 10), np.float32), other=np.zeros(3))
    elif kind == "wrong_shape":
        np.savez(path, linear=np.zeros((2, 10), np.float32))
    elif kind == "object":
        np.savez(path, linear=np.array([1, None], dtype=object))
    else:
        raise ValueError(kind)
    if not path.exists() and path.with_suffix(path.suffix + ".npz").exists():
        path.with_suffix(path.suffix + ".npz").rename(path)


def _file(path: Path, kind: str) -> None:
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "ir_garbage":
        path.write_text('{"graph_inputs": [], "graph_outputs": [{"name": "x"}], "nodes": 5}')
    elif kind == "ir_deep":
        path.write_text("{\"nodes\": " + "[" * 200_000 + "]" * 200_000 + "}")
    elif kind == "ir_bigint":
        path.write_text('{"graph_inputs": [{"name": "x", "shape": [' + "9" * 10_000 + '], "dtype": "float32"}], '
                        '"graph_outputs": [], "nodes": []}')
    else:
        raise ValueError(kind)


def materialise(case: dict, ctx) -> list[str]:
    """The case's argv with its files made (in the worker's own folder, fresh for each case)."""
    from npu_compiler.program import CompiledProgram

    out = ctx.work / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    if not (ctx.work / "x_ok.npy").exists():
        _npy(ctx.work / "x_ok.npy", "ok")
    seeds = ctx.seed_dir
    names = {"{ART}": seeds / "resnet_f32.npubin", "{IR}": seeds / "resnet.json", "{W}": seeds / "resnet.safetensors",
             "{ART_Q}": seeds / "qwen_decode_f32.npubin", "{WQ}": seeds / "qwen.safetensors", "{LLM}": seeds / "llm",
             "{OUT}": out, "{MISSING}": ctx.work / "missing" / "deeper", "{DIR}": ctx.work / "adir",
             "{FIFO}": out / "fifo", "{LINK}": out / "link"}
    (ctx.work / "adir").mkdir(exist_ok=True)
    os.mkfifo(out / "fifo")  # outputs that must be refused, never replaced: a FIFO, a link to a file
    (ctx.work / "victim").write_text("keep")
    (out / "link").symlink_to(ctx.work / "victim")
    argv = []
    for a in case["argv"]:
        if "{KERNEL_NAME}" in a:
            a = a.replace("{KERNEL_NAME}", CompiledProgram.load(names["{ART}"]).kernels[1].name)
        m = re.fullmatch(r"\{LLMBAD:(\w+)\}", a)
        if m:
            a = str(_damaged_folder(ctx, m.group(1)))
        for m in re.finditer(r"\{(NPY|NPZ|FILE):(\w+)\}", a):
            what, kind = m.group(1), m.group(2)
            path = out / f"{what.lower()}_{kind}.{'npz' if what == 'NPZ' else 'npy' if what == 'NPY' else 'dat'}"
            if what == "NPY":
                _npy(path, kind)
            elif what == "NPZ":
                _npz(path, kind, ctx)
            else:
                _file(path, kind)
            a = a.replace(m.group(0), str(path))
        for k, v in names.items():
            a = a.replace(k, str(v))
        argv.append(a)
    return argv


def _damaged_folder(ctx, kind: str) -> Path:
    """A copy of the seeds' export-llm folder with one file damaged as FOLDER_DAMAGE[kind] says."""
    folder = ctx.work / "out" / "llm"
    shutil.copytree(ctx.seed_dir / "llm", folder)
    name, path, value = FOLDER_DAMAGE[kind]
    target = folder / name
    if path is None:
        if value is None:
            target.unlink()
        else:
            target.write_text(value)
        return folder
    data = json.loads(target.read_text())
    node = data
    for key in path[:-1]:
        node = node[key]
    if value == "__delete__":
        del node[path[-1]]
    else:
        node[path[-1]] = value
    target.write_text(json.dumps(data))
    return folder


def check_outputs(case: dict, ctx, stdout: str) -> str | None:
    """For an accepted command that writes files: the file is there, whole, and has the umask's permissions."""
    argv = case["argv"]
    mode = 0o666 & ~0o027  # the workers' umask
    written = []
    for flag in ("-o", "--trace", "--chart"):
        if flag in argv:
            target = argv[argv.index(flag) + 1].replace("{OUT}", str(ctx.work / "out"))
            written.append(Path(target))
    for p in written:
        if argv[0] == "export":
            continue
        if not p.is_file():
            return f"{' '.join(argv[:2])}: reported success but {p.name} was not written"
        if p.stat().st_mode & 0o777 != mode:
            return f"{p.name} written with mode {oct(p.stat().st_mode & 0o777)}, the umask gives {oct(mode)}"
        try:
            if p.suffix == ".json":
                json.loads(p.read_text())
            elif p.suffix == ".npz":
                with np.load(p, allow_pickle=False) as z:
                    list(z.values())
            elif argv[0] == "compile":
                from npu_compiler.program import CompiledProgram

                CompiledProgram.load(p)
        except Exception as e:
            return f"{p.name} does not read back: {type(e).__name__}: {e}"
    leftovers = [f.name for f in (ctx.work / "out").iterdir() if f.name.startswith(".")]
    if leftovers:
        return f"temporary files left behind: {leftovers}"
    return None


def cleanup(ctx) -> None:
    shutil.rmtree(ctx.work / "out", ignore_errors=True)
    os.makedirs(ctx.work / "out", exist_ok=True)
