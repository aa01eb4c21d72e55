"""Mutators: each case is a list of operations on a seed (`gen_*` draws them from a seeded RNG, `apply_*` applies
them), so a case is small, replayable data (the corpus stores the operations and the seed's name, not the input).

Operations on a JSON-like tree (the IR, the artifact's data form, a safetensors header):
    ["set", path, value]      value may hold specials: {"$": "nan" | "inf" | "-inf"}, {"$": "bigint", "digits": n},
                              {"$": "nest", "depth": n}, {"$": "longstr", "len": n}, {"$": "bigarray", "len": n}
    ["del", path]  ["dup", path]  ["move", path, index]
and on the serialised bytes: ["bytes", "truncate", fraction], ["bytes", "flip", fraction, xor],
["bytes", "insert", fraction, text]. Strings may hold "{CANARY}": a path the worker checks after every case (a
payload that runs would create it).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import struct
from typing import Any

import msgpack

Path_ = list  # a path: keys (str) and indices (int)

CANARY_PAYLOADS = [
    "';import os;os.system('touch {CANARY}');'",
    '"""\nimport os; os.system("touch {CANARY}")\n"""',
    "$(touch {CANARY})",
    "`touch {CANARY}`",
    "}}; require('child_process').exec('touch {CANARY}'); {{",
    "\"];\n  k0 -> x [URL=\"javascript:touch('{CANARY}')\"]; x [label=\"",
    "\"]\n  click k0 call touch(\"{CANARY}\")\n  x[\"",
]
HOSTILE_STRINGS = ["", "x", "\x1b]0;pwned\x07\x1b[2J", "a\nb\r\nc", "\u202eevil", "\x00", "💥" * 3, "\\", "\"'",
                   "../../etc/passwd", "%s%n%x", "{0}{1}", "<script>alert(1)</script>"] + CANARY_PAYLOADS
DTYPE_NAMES = ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool",
               "torch.float32", "torch.int64", "float33", "complex64", "float8_e4m3fn", "", "Float"]


def special(kind: str, **kw: Any) -> dict:
    return {"$": kind, **kw}


INTERESTING: list[Any] = [
    None, True, False, 0, 1, -1, 2, 3, 7, 64, 2**31, 2**32 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 10**12, 10**18,
    10**30, 0.0, -0.0, 0.5, -1.5, 1e-30, 1e308, special("nan"), special("inf"), special("-inf"),
    special("bigint", digits=5000), special("nest", depth=100_000), special("longstr", len=1_000_000),
    special("bigarray", len=200_000), [], [0], [-1], [1, 2], [10**12], [[1]], {}, {"a": 1}, *DTYPE_NAMES[:4],
    *HOSTILE_STRINGS,
]


# ---- trees --------------------------------------------------------------------------------------------------------


def walk(tree: Any) -> list[tuple[Path_, Any]]:
    """Every (path, value) of the tree, iteratively."""
    out: list[tuple[Path_, Any]] = []
    stack: list[tuple[Path_, Any]] = [([], tree)]
    while stack:
        path, v = stack.pop()
        out.append((path, v))
        if isinstance(v, dict):
            stack.extend((path + [k], x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((path + [i], x) for i, x in enumerate(v))
    return out


def get(tree: Any, path: Path_) -> Any:
    for k in path:
        tree = tree[k]
    return tree


class Stale(Exception):
    """A recorded operation no longer applies to its seed (the seed changed): the corpus case needs updating."""


def _parent(tree: Any, path: Path_) -> tuple[Any, Any]:
    if not path:
        raise Stale("empty path")
    try:
        return get(tree, path[:-1]), path[-1]
    except (KeyError, IndexError, TypeError) as e:
        raise Stale(f"path {path} does not exist") from e


_PLACEHOLDER = "@@FUZZ{}@@"


def _materialise(v: Any, texts: dict[str, str]) -> Any:
    """Specials -> Python values; the ones JSON/msgpack cannot carry become placeholders replaced in the bytes."""
    if isinstance(v, dict) and "$" in v:
        kind = v["$"]
        if kind == "nan":
            return float("nan")
        if kind in ("inf", "-inf"):
            return float(kind)
        if kind == "longstr":
            return "A" * int(v["len"])
        if kind == "bigarray":
            return [0] * int(v["len"])
        key = _PLACEHOLDER.format(len(texts))
        if kind == "bigint":
            texts[key] = "9" * int(v["digits"])
        elif kind == "nest":
            texts[key] = "[" * int(v["depth"]) + "]" * int(v["depth"])
        else:
            raise Stale(f"unknown special {kind!r}")
        return key
    if isinstance(v, list):
        return [_materialise(x, texts) for x in v]
    if isinstance(v, dict):
        return {k: _materialise(x, texts) for k, x in v.items()}
    return v


def apply_tree_ops(tree: Any, ops: list, texts: dict[str, str], canary: str) -> Any:
    tree = copy.deepcopy(tree)
    for op in ops:
        kind = op[0]
        if kind == "bytes":
            continue
        if kind == "set":
            value = _materialise(_canary(op[2], canary), texts)
            if not op[1]:
                tree = value
                continue
            parent, key = _parent(tree, op[1])
            try:
                parent[key] = value
            except (IndexError, TypeError) as e:
                raise Stale(f"cannot set {op[1]}") from e
        elif kind == "del":
            parent, key = _parent(tree, op[1])
            try:
                del parent[key]
            except (KeyError, IndexError, TypeError) as e:
                raise Stale(f"cannot delete {op[1]}") from e
        elif kind == "dup":
            parent, key = _parent(tree, op[1])
            if not isinstance(parent, list) or not 0 <= key < len(parent):
                raise Stale(f"cannot duplicate {op[1]}")
            parent.insert(key + 1, copy.deepcopy(parent[key]))
        elif kind == "move":
            parent, key = _parent(tree, op[1])
            if not isinstance(parent, list) or not 0 <= key < len(parent):
                raise Stale(f"cannot move {op[1]}")
            item = parent.pop(key)
            parent.insert(min(max(op[2], 0), len(parent)), item)
        else:
            raise Stale(f"unknown operation {kind!r}")
    return tree


def _canary(v: Any, canary: str) -> Any:
    if isinstance(v, str):
        return v.replace("{CANARY}", canary)
    if isinstance(v, list):
        return [_canary(x, canary) for x in v]
    if isinstance(v, dict):
        return {k: _canary(x, canary) for k, x in v.items()}
    return v


def apply_byte_ops(blob: bytes, ops: list) -> bytes:
    for op in ops:
        if op[0] != "bytes":
            continue
        what = op[1]
        pos = int(len(blob) * min(max(float(op[2]), 0.0), 1.0))
        if what == "truncate":
            blob = blob[:pos]
        elif what == "flip" and blob:
            pos = min(pos, len(blob) - 1)
            blob = blob[:pos] + bytes([blob[pos] ^ (int(op[3]) & 0xFF or 1)]) + blob[pos + 1:]
        elif what == "insert":
            blob = blob[:pos] + str(op[3]).encode("utf-8", "surrogatepass") + blob[pos:]
        else:
            raise Stale(f"unknown byte operation {what!r}")
    return blob


# ---- IR -----------------------------------------------------------------------------------------------------------


def apply_ir(seed: dict, ops: list, canary: str) -> str:
    """The mutated IR as JSON text (the compiler reads a JSON string as it reads a file)."""
    texts: dict[str, str] = {}
    tree = apply_tree_ops(seed, ops, texts, canary)
    text = json.dumps(tree, allow_nan=True)
    for key, raw in texts.items():
        text = text.replace(json.dumps(key), raw)
    return apply_byte_ops(text.encode("utf-8", "surrogatepass"), ops).decode("utf-8", "replace")


UNARY_SWAP = ["aten.relu.default", "aten.sigmoid.default", "aten.tanh.default", "aten.silu.default",
              "aten.gelu.default", "aten.neg.default", "aten.abs.default", "aten.sin.default", "aten.cos.default",
              "aten.erf.default"]
BINARY_SWAP = ["aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.maximum.default",
               "aten.minimum.default", "aten.div.Tensor"]


def _known_ops() -> list[str]:
    from npu_compiler.ir.schema import SCHEMAS

    return [f"aten.{op}" for op in sorted(SCHEMAS)] + ["aten.cumsum.default", "aten.nonexistent.default", "getitem",
                                                        "aten.relu_.default", "aten.add_.Tensor", "bogus"]


def _nodes(ir: dict) -> list[dict]:
    return ir.get("nodes") or []


def _pick_node(r: random.Random, ir: dict, pred=lambda n: True) -> int | None:
    idx = [i for i, n in enumerate(_nodes(ir)) if pred(n)]
    return r.choice(idx) if idx else None


def _plausible_int(r: random.Random, v: int) -> Any:
    return r.choice([v + 1, v - 1, -v, 0, -1, 2 * v + 1, 2**31, 10**12, v * 100])


def _attr_value(r: random.Random, v: Any) -> Any:
    if isinstance(v, bool):
        return r.choice([not v, 0, 1, None, "true"])
    if isinstance(v, int):
        return _plausible_int(r, v)
    if isinstance(v, float):
        return r.choice([-v, 0.0, v * 10, special("nan"), special("inf"), -1.0, 1e300, int(v) if math.isfinite(v)
                         else 0])
    if isinstance(v, list):
        choice = r.random()
        if not v or choice < 0.3:
            return [r.choice([0, 1, 2, -1, 3])] * r.randint(0, 4)
        v = list(v)
        i = r.randrange(len(v))
        if choice < 0.8 and isinstance(v[i], int) and not isinstance(v[i], bool):
            v[i] = _plausible_int(r, v[i])
        elif choice < 0.9:
            v.append(r.choice([1, -1, 0]))
        else:
            v.pop(i)
        return v
    if isinstance(v, str):
        return r.choice(DTYPE_NAMES + ["none", "tanh", "floor", "trunc", "cpu", "meta", "torch.strided", ""])
    return r.choice(INTERESTING)


def _then(tree: Any, ops: list) -> Any:
    """`tree` after `ops` (the next operation is drawn on what the earlier ones left), or None when a special
    value makes it unusable for drawing."""
    try:
        return apply_tree_ops(tree, [o for o in ops if o[0] != "bytes"], {}, "")
    except Stale:
        return None


def gen_ir_ops(r: random.Random, ir: dict) -> list:
    """One to three operations on a seed IR, each drawn on the IR the earlier ones made."""
    ops: list = []
    cur = ir
    for _ in range(r.choice([1, 1, 1, 2, 3])):
        if not isinstance(cur, dict) or not isinstance(cur.get("nodes"), list) or not cur["nodes"] \
                or not isinstance(cur.get("graph_inputs"), list) or not cur["graph_inputs"]:
            break
        try:
            new = _ir_op(r, cur)
        except (KeyError, TypeError, IndexError, AttributeError, ValueError):
            break  # the IR is too broken to draw another structured operation on
        ops.extend(new)
        cur = _then(cur, new)
    return ops or [["set", ["model_name"], "x"]]


def _ir_op(r: random.Random, ir: dict) -> list:
    nodes = _nodes(ir)
    strategy = r.choices(["value", "shape", "dtype", "attr", "op", "ref", "struct", "bytes", "valid", "names"],
                         weights=[14, 12, 9, 16, 7, 9, 9, 5, 14, 5])[0]
    if strategy == "value":
        paths = walk(ir)
        path, _ = r.choice(paths[1:])
        return [["set", path, r.choice(INTERESTING)]]
    if strategy == "shape":
        shapes = [(p, v) for p, v in walk(ir) if p and p[-1] == "shape" and isinstance(v, list)]
        path, shape = r.choice(shapes)
        shape = list(shape)
        c = r.random()
        if shape and c < 0.6:
            i = r.randrange(len(shape))
            shape[i] = r.choice([shape[i] + 1, max(shape[i] - 1, 0), shape[i] * 2, 0, 1, 10**12, -1, 2**40])
        elif c < 0.8:
            shape.insert(r.randint(0, len(shape)), r.choice([1, 2]))
        elif shape:
            shape.pop(r.randrange(len(shape)))
        return [["set", path, shape]]
    if strategy == "dtype":
        dts = [p for p, v in walk(ir) if p and p[-1] == "dtype"]
        return [["set", r.choice(dts), r.choice(DTYPE_NAMES[:10] * 3 + DTYPE_NAMES)]]
    if strategy == "attr":
        i = _pick_node(r, ir, lambda n: bool(n.get("attrs")))
        if i is None or r.random() < 0.15:
            i = r.randrange(len(nodes))
            return [["set", ["nodes", i, "attrs", r.choice(["dim", "stride", "padding", "groups", "alpha", "eps",
                                                             "index", "size", "bogus", "other", "dtype", "_x"])],
                     r.choice(INTERESTING)]]
        attrs = nodes[i]["attrs"]
        key = r.choice(sorted(attrs))
        if r.random() < 0.15:
            return [["del", ["nodes", i, "attrs", key]]]
        return [["set", ["nodes", i, "attrs", key], _attr_value(r, attrs[key])]]
    if strategy == "op":
        i = r.randrange(len(nodes))
        return [["set", ["nodes", i, "op_type"], r.choice(_known_ops())]]
    if strategy == "ref":
        refs = [(p, v) for p, v in walk(ir) if p and p[-1] in ("producer_node", "producer_output_idx")]
        names = [n["name"] for n in nodes] + [t["name"] for t in ir["graph_inputs"]]
        path, v = r.choice(refs)
        if path[-1] == "producer_node":
            return [["set", path, r.choice(names + ["nope", None, 3])]]
        return [["set", path, r.choice([1, 2, -1, 3, "0", 2**40])]]
    if strategy == "struct":
        c = r.randrange(9)
        i = r.randrange(len(nodes))
        if c == 0:
            return [["del", ["nodes", i]]]
        if c == 1:
            return [["dup", ["nodes", i]]]
        if c == 2:
            return [["move", ["nodes", i], r.randrange(len(nodes))]]
        if c == 3 and nodes[i]["inputs"]:
            return [["del", ["nodes", i, "inputs", r.randrange(len(nodes[i]["inputs"]))]]]
        if c == 4 and nodes[i]["inputs"]:
            return [["dup", ["nodes", i, "inputs", r.randrange(len(nodes[i]["inputs"]))]]]
        if c == 5 and nodes[i]["outputs"]:
            return [["del", ["nodes", i, "outputs", r.randrange(len(nodes[i]["outputs"]))]]]
        if c == 6:
            return [["del", ["graph_inputs", r.randrange(len(ir["graph_inputs"]))]]]
        if c == 7:
            key = r.choice(sorted(ir))
            return [["del", [key]]]
        return [["set", ["graph_outputs", 0, "name"], r.choice([n["name"] for n in nodes])]]
    if strategy == "bytes":
        c = r.randrange(3)
        if c == 0:
            return [["bytes", "truncate", r.random()]]
        if c == 1:
            return [["bytes", "flip", r.random(), r.randrange(1, 256)]]
        return [["bytes", "insert", r.random(), r.choice(["[", "]", "{", "\"", ",", "NaN", "-", "1e99999", "\\u0000",
                                                           "\\ud800"])]]
    if strategy == "valid":
        return _valid_op(r, ir)
    # names: hostile strings where the input's own names go (model name, node and tensor names)
    target = r.choice(["model", "node", "weight"])
    if target == "model":
        return [["set", ["model_name"], r.choice(HOSTILE_STRINGS)]]
    if target == "node":
        i = r.randrange(len(nodes))
        return [["set", ["nodes", i, "name"], r.choice(HOSTILE_STRINGS)]]
    keys = sorted(ir.get("weight_name_mapping") or {})
    if not keys:
        return [["set", ["model_name"], r.choice(CANARY_PAYLOADS)]]
    return [["set", ["weight_name_mapping", r.choice(keys)], r.choice(HOSTILE_STRINGS)]]


def _valid_op(r: random.Random, ir: dict) -> list:
    """A mutation that keeps the graph valid: another unary or binary op of the same types, another scalar."""
    nodes = _nodes(ir)

    def float_io(n: dict) -> bool:
        return all(str(t.get("dtype", "")).startswith("float") for t in n["inputs"] + n["outputs"])

    c = r.randrange(3)
    if c == 0:
        i = _pick_node(r, ir, lambda n: n["op_type"] in UNARY_SWAP + ["aten.relu_.default"] and float_io(n))
        if i is not None:
            return [["set", ["nodes", i, "op_type"], r.choice(UNARY_SWAP)], ["set", ["nodes", i, "attrs"], {}]]
    if c == 1:
        i = _pick_node(r, ir, lambda n: n["op_type"] in BINARY_SWAP + ["aten.add_.Tensor"] and len(n["inputs"]) == 2
                       and float_io(n))
        if i is not None:
            return [["set", ["nodes", i, "op_type"], r.choice(BINARY_SWAP)], ["set", ["nodes", i, "attrs"], {}]]
    i = _pick_node(r, ir, lambda n: any(isinstance(v, float) and not isinstance(v, bool)
                                        for v in (n.get("attrs") or {}).values()))
    if i is None:
        return [["set", ["model_name"], "renamed"]]
    key = r.choice([k for k, v in nodes[i]["attrs"].items() if isinstance(v, float)])
    v = nodes[i]["attrs"][key]
    return [["set", ["nodes", i, "attrs", key], r.choice([v * 2, v / 2, v + 1, abs(v) + 0.5])]]


# ---- artifacts ----------------------------------------------------------------------------------------------------

HEADER = struct.Struct("<8sIQ32s")  # magic, version, payload length, the payload's SHA-256


def artifact_data(blob: bytes) -> dict:
    return msgpack.unpackb(blob[HEADER.size:], raw=False, strict_map_key=False)


def apply_artifact(seed_blob: bytes, ops: list, canary: str) -> bytes:
    """The mutated artifact: the data form mutated and repacked with a valid header and checksum (what anyone can
    produce), then any byte operations; ["header", field, value] edits the header after the checksum."""
    texts: dict[str, str] = {}
    tree = apply_tree_ops(artifact_data(seed_blob), [o for o in ops if o[0] != "header"], texts, canary)
    payload = msgpack.packb(_clamp_ints(tree), use_bin_type=True)
    for key, raw in texts.items():
        packed = msgpack.packb(key, use_bin_type=True)
        if raw.startswith("["):  # nesting: msgpack fixarray of one element, n deep, around nil
            depth = raw.count("[")
            payload = payload.replace(packed, b"\x91" * depth + b"\xc0")
        else:  # a number too large for msgpack: the largest it has
            payload = payload.replace(packed, b"\xcf" + b"\xff" * 8)
    payload = apply_byte_ops(payload, ops)
    magic, version, _, _ = HEADER.unpack_from(seed_blob)
    fields = {"magic": magic, "version": version, "length": len(payload), "sha256": hashlib.sha256(payload).digest()}
    for op in ops:
        if op[0] == "header":
            fields[op[1]] = op[2] if op[1] != "magic" else str(op[2]).encode()[:8]
    try:
        digest = fields["sha256"]
        if isinstance(digest, int):  # an edited checksum: that number's bytes
            digest = (digest & (2**256 - 1)).to_bytes(32, "little")
        head = HEADER.pack(fields["magic"], fields["version"] & 0xFFFFFFFF, fields["length"] & (2**64 - 1), digest)
    except (struct.error, TypeError) as e:
        raise Stale(f"header: {e}") from e
    return head + payload


EXPR_TAGS = {"binary", "unary", "load", "gather", "const", "cast", "where", "reduce", "index", "rindex", "acc"}


def _clamp_ints(tree: Any) -> Any:
    """Integers beyond what msgpack holds become its largest (a crafted file cannot hold more)."""
    if isinstance(tree, bool):
        return tree
    if isinstance(tree, int):
        return min(max(tree, -(2**63)), 2**64 - 1)
    if isinstance(tree, list):
        return [_clamp_ints(x) for x in tree]
    if isinstance(tree, dict):
        return {k: _clamp_ints(v) for k, v in tree.items()}
    return tree


def _vocabulary(tree: Any) -> list[str]:
    return sorted({v for _, v in walk(tree) if isinstance(v, str) and len(v) < 40})


def gen_artifact_ops(r: random.Random, seed_blob: bytes) -> list:
    data = artifact_data(seed_blob)
    ops: list = []
    for _ in range(r.choice([1, 1, 1, 2, 3])):
        if not isinstance(data, dict):
            break
        try:
            new = _artifact_op(r, data)
        except (KeyError, TypeError, IndexError, AttributeError, ValueError):
            break
        ops.extend(new)
        data = _then(data, [o for o in new if o[0] != "header"])
    return ops or [["set", ["model_name"], "x"]]


SEGMENT_FIELDS = ["index", "device", "runner", "nodes", "inputs", "outputs", "flops", "program", "ir"]
TORCH_OPS = ["aten.from_file.default", "aten.__class__.__init__", "aten.__dict__.clear", "os.system", "aten.add",
             "aten.nonexistent.default", "aten.sort.default", "aten.empty.memory_format", "getitem",
             "aten._print.default", "builtins.eval.default", "aten.add.Tensor"]


def _segment_op(r: random.Random, data: dict) -> list:
    """A partitioned artifact's segment fields: its runner and device, its boundary tensors, the list itself, a torch
    segment's ops and attributes (hostile op names among them), the report's entries."""
    segs = data["segments"]
    i = r.randrange(len(segs))
    seg = segs[i]
    c = r.randrange(8)
    if c == 0:
        return [["set", ["segments", i, r.choice(SEGMENT_FIELDS)], r.choice(INTERESTING[:40] + ["cpu", "npu", "torch",
                                                                                              "reference", "target"])]]
    if c == 1:
        return [["set", ["segments", i, "runner"], r.choice(["target", "reference", "torch", "python"])]]
    if c == 2 and seg.get("ir"):
        j = r.randrange(len(seg["ir"]["nodes"]))
        return [["set", ["segments", i, "ir", "nodes", j, "op_type"], r.choice(TORCH_OPS + CANARY_PAYLOADS)]]
    if c == 3 and seg.get("ir"):
        j = r.randrange(len(seg["ir"]["nodes"]))
        return [["set", ["segments", i, "ir", "nodes", j, "attrs", r.choice(["output_size", "dim", "x", "dtype"])],
                 r.choice(INTERESTING)]]
    if c == 4:
        j, k = r.randrange(len(segs)), r.randrange(len(segs))
        return [["set", ["segments", i, r.choice(["inputs", "outputs"])], segs[j][r.choice(["inputs", "outputs"])]
                 if k % 2 else []]]
    if c == 5:
        return [["move", ["segments", i], r.randrange(len(segs))]] if r.random() < 0.5 else [["del", ["segments", i]]]
    if c == 6 and data.get("fallback"):
        j = r.randrange(len(data["fallback"]))
        return [["set", ["fallback", j, r.choice(["name", "partition", "runner", "op"])],
                 r.choice(INTERESTING[:30] + ["linear", "torch", "reference"])]]
    key = r.choice(["inputs", "outputs"])
    return [["set", [key, 0, r.choice(["name", "shape", "dtype", "device_dtype", "alias_of", "value_range"])],
             r.choice(INTERESTING[:40] + DTYPE_NAMES[:6])]]


def _artifact_op(r: random.Random, data: dict) -> list:
    if "segments" in data and r.random() < 0.4:
        return _segment_op(r, data)
    strategy = r.choices(["int", "string", "value", "list", "dict", "expr", "bytes", "header"],
                         weights=[30, 14, 12, 12, 8, 14, 6, 4])[0]
    paths = walk(data)
    if strategy == "int":
        ints = [(p, v) for p, v in paths if isinstance(v, int) and not isinstance(v, bool) and p]
        path, v = r.choice(ints)
        value = r.choice([v + 1, v - 1, 0, -1, 1, v * 2, v + 64, 2**31, 2**40, 2**62, 2**63, 2**64 - 1, -(2**63)])
        return [["set", path, min(max(value, -(2**63)), 2**64 - 1)]]  # what msgpack can hold
    if strategy == "string":
        strs = [(p, v) for p, v in paths if isinstance(v, str) and p]
        path, _ = r.choice(strs)
        return [["set", path, r.choice(_vocabulary(data) + HOSTILE_STRINGS[:6])]]
    if strategy == "value":
        path, _ = r.choice(paths[1:])
        v = r.choice(INTERESTING)
        if isinstance(v, dict) and v.get("$") in ("bigint",):
            v = 2**64 - 1
        return [["set", path, v]]
    if strategy == "list":
        lists = [(p, v) for p, v in paths if isinstance(v, list) and v and p]
        path, v = r.choice(lists)
        c = r.randrange(4)
        i = r.randrange(len(v))
        if c == 0:
            return [["del", path + [i]]]
        if c == 1:
            return [["dup", path + [i]]]
        if c == 2:
            return [["move", path + [i], r.randrange(len(v))]]
        return [["set", path, v[: r.randrange(len(v))]]]
    if strategy == "dict":
        dicts = [(p, v) for p, v in paths if isinstance(v, dict) and v and p]
        path, v = r.choice(dicts)
        if r.random() < 0.7:
            return [["del", path + [r.choice(sorted(map(str, v)))]]]
        return [["set", path + ["extra"], r.choice(INTERESTING[:20])]]
    if strategy == "expr":
        exprs = [(p, v) for p, v in paths if p and isinstance(v, list) and v and isinstance(v[0], str)
                 and v[0] in EXPR_TAGS]
        if not exprs:
            return [["set", r.choice(paths[1:])[0], r.choice(INTERESTING)]]
        path, v = r.choice(exprs)
        c = r.randrange(5)
        if c == 0:  # another subtree in its place
            return [["set", path, r.choice(exprs)[1]]]
        if c == 1:  # an operand dropped or added
            return [["set", path, v[:-1] if r.random() < 0.5 else v + [v[-1]]]]
        i = r.randrange(1, len(v))
        x = v[i]
        if isinstance(x, str):
            new: Any = r.choice(_vocabulary(data) + ["pow", "mod", "nope"])
        elif isinstance(x, int) and not isinstance(x, bool):
            new = min(max(r.choice([x + 1, x - 1, -1, 0, 2**31, 2**62, x * 1000]), -(2**63)), 2**64 - 1)
        elif isinstance(x, float):
            new = r.choice([special("nan"), special("inf"), -x, 1e300, 0.0])
        elif isinstance(x, list) and x and all(isinstance(y, int) for y in x):
            y = list(x)
            j = r.randrange(len(y))
            y[j] = min(max(r.choice([y[j] + 1, -1, 0, 2**40, y[j] * 7]), -(2**63)), 2**64 - 1)
            new = y if r.random() < 0.8 else y + [1]
        else:
            new = r.choice(INTERESTING[:30])
        return [["set", path + [i], new]]
    if strategy == "bytes":
        return [["bytes", "flip", r.random(), r.randrange(1, 256)]] if r.random() < 0.8 else \
            [["bytes", "truncate", r.random()]]
    field_ = r.choice(["version", "length", "sha256", "magic"])
    if field_ == "magic":
        return [["header", "magic", r.choice(["NPUBIN\x00\x1b", "PK\x03\x04", ""])]]
    return [["header", field_, r.choice([0, 1, 3, 2**32 - 1, 2**40])]]


# ---- safetensors --------------------------------------------------------------------------------------------------


def split_safetensors(blob: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _itemsize(dt: str) -> int:
    return {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
            "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}.get(dt, 4)


def apply_weights(seed_blob: bytes, ops: list, canary: str) -> bytes:
    """A mutated safetensors file. Besides tree operations on the header: ["poison", key, index, "nan"|"inf"] writes
    one value into a float tensor, ["reencode", key, dtype] rewrites one tensor in another dtype (its bytes
    converted, every offset after it moved), ["length", n] sets the header length field."""
    import numpy as np
    import torch

    header, data = split_safetensors(seed_blob)
    data = bytearray(data)
    for op in ops:
        if op[0] == "poison":
            info = header.get(op[1])
            if not isinstance(info, dict) or info.get("dtype") != "F32":
                raise Stale(f"no F32 tensor {op[1]}")
            b, e = info["data_offsets"]
            n = (e - b) // 4
            if n == 0:
                raise Stale("empty tensor")
            pos = b + 4 * (int(op[2]) % n)
            data[pos:pos + 4] = struct.pack("<f", float(op[3]))
        elif op[0] == "reencode":
            info = header.get(op[1])
            if not isinstance(info, dict) or info.get("dtype") != "F32":
                raise Stale(f"no F32 tensor {op[1]}")
            b, e = info["data_offsets"]
            arr = torch.from_numpy(np.frombuffer(bytes(data[b:e]), dtype="<f4").copy())
            dt = {"F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn,
                  "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32, "I8": torch.int8,
                  "U8": torch.uint8, "BOOL": torch.bool, "I16": torch.int16}[op[2]]
            new = arr.to(dt).view(torch.uint8).numpy().tobytes() if dt.itemsize > 0 else b""
            delta = len(new) - (e - b)
            data[b:e] = new
            info["dtype"] = op[2]
            info["data_offsets"] = [b, b + len(new)]
            for k, other in header.items():
                if k != op[1] and isinstance(other, dict) and "data_offsets" in other and other["data_offsets"][0] >= e:
                    other["data_offsets"] = [other["data_offsets"][0] + delta, other["data_offsets"][1] + delta]
    texts: dict[str, str] = {}
    header = apply_tree_ops(header, [o for o in ops if o[0] in ("set", "del", "dup", "move")], texts, canary)
    text = json.dumps(header, allow_nan=True)
    for key, raw in texts.items():
        text = text.replace(json.dumps(key), raw)
    head = text.encode("utf-8", "surrogatepass")
    length = len(head)
    for op in ops:
        if op[0] == "length":
            length = int(op[1]) & (2**64 - 1)
    return apply_byte_ops(struct.pack("<Q", length) + head + bytes(data), ops)


def gen_weights_ops(r: random.Random, seed_blob: bytes) -> list:
    header, _ = split_safetensors(seed_blob)
    keys = sorted(k for k in header if k != "__metadata__")
    floats = [k for k in keys if header[k]["dtype"] == "F32" and header[k]["data_offsets"][1] >
              header[k]["data_offsets"][0]]
    key = r.choice(floats)
    c = r.choices(["poison", "reencode", "dtype", "shape", "offsets", "entry", "meta", "length", "bytes", "value"],
                  weights=[18, 18, 12, 10, 10, 8, 4, 5, 10, 5])[0]
    if c == "poison":
        return [["poison", key, r.randrange(1 << 20), r.choice(["nan", "inf", "-inf", "nan"])]]
    if c == "reencode":
        return [["reencode", key, r.choice(["F16", "BF16", "F64", "F8_E4M3", "F8_E5M2", "I64", "I32", "I8", "U8",
                                             "BOOL", "I16"])]]
    if c == "dtype":
        return [["set", [key, "dtype"], r.choice(["I32", "U32", "F16", "BF16", "I64", "BOOL", "U8", "F8_E4M3",
                                                  "C64", "F4", "XYZ", "", 3])]]
    if c == "shape":
        shape = list(header[key]["shape"])
        if shape and r.random() < 0.7:
            i = r.randrange(len(shape))
            shape[i] = r.choice([shape[i] + 1, 0, 2**40, -1, shape[i] * 2])
        else:
            shape = r.choice([[], [2**62, 2**62], shape + [1], [special("nan")]])
        return [["set", [key, "shape"], shape]]
    if c == "offsets":
        b, e = header[key]["data_offsets"]
        return [["set", [key, "data_offsets"], r.choice([[b, e + 4], [b + 4, e + 4], [0, e - b], [e, b], [b, 2**63],
                                                         [-4, e], [b], [b, e, 0], [str(b), e]])]]
    if c == "entry":
        if r.random() < 0.5:
            return [["del", [key]]]
        return [["set", [r.choice(HOSTILE_STRINGS[:6] + ["extra.weight"])], dict(header[key])]]
    if c == "meta":
        return [["set", ["__metadata__"], r.choice([{"a": 1}, [], "x", {"format": "pt"}, None,
                                                    special("nest", depth=10_000)])]]
    if c == "length":
        return [["length", r.choice([0, 1, 7, 2**32, 2**63, 2**64 - 1, 10**8])]]
    if c == "bytes":
        return [["bytes", "truncate", r.random()]] if r.random() < 0.5 else \
            [["bytes", "flip", r.random(), r.randrange(1, 256)]]
    return [["set", [key], r.choice(INTERESTING)]]
