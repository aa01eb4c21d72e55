"""A mapping given by the user (npu_compiler/npu/mapping.py, `npusim estimate --mapping FILE`): the row-stationary
channels and filters a pass of the layers it names, instead of the mapper's, with the cycles and buffer traffic
that follow worked out by hand; every hostile mapping file refused with one line naming the file, layer and field.

Reference: Chen et al., "Eyeriss", IEEE JSSC 2017 (the scratchpads: 12 input, 224 filter, 24 partial-sum entries a
PE; the 64-bit partial-sum networks), the preset `eyeriss`.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import export_ir

import npu_compiler
from npu_compiler.npu import ConvWork, GemmWork, Operand, estimate, estimate_program, load_npu
from npu_compiler.npu.mapping import LayerMapping, MappingError, by_program, load_mapping, parse_mapping


def _conv3() -> ConvWork:
    """AlexNet's CONV3 at batch 4: 256 -> 384 channels, 3 x 3, 13 x 13 (the layer of test_npu_mechanisms)."""
    return ConvWork(4, 256, 15, 15, 384, 3, 3, 13, 13, Operand(4 * 256 * 225 * 2, elem=2),
                    Operand(384 * 256 * 9 * 2, constant=True), Operand(4 * 384 * 169 * 2), (1, 1), (0, 0),
                    dtypes=("int16", "int16"), out_dtype="int16")


def test_given_channels_a_pass_set_the_partial_sum_passes_by_hand():
    """The mapper takes q = 12 // 3 = 4 channels a pass (64 passes; the networks' four 16-bit sums a cycle carry
    4 x 36 MACs). Given q = 1, 256 passes each send 4 x 384 x 169 partial sums out: 16,613,376 cycles on the
    networks (4 x 9 MACs a cycle); q = 2: half that. The array's own cycles do not change."""
    eyeriss = load_npu("eyeriss")
    conv, macs = _conv3(), 4 * 384 * 256 * 9 * 169
    mapper = estimate(conv, eyeriss)
    assert mapper.detail["channels_per_pass"] == 4 and mapper.onchip_cycles == 4_153_344
    one = estimate(conv, eyeriss, LayerMapping(channels_per_pass=1))
    assert one.detail["psum_passes"] == 256 and one.onchip_cycles == macs / 36 == 16_613_376
    two = estimate(conv, eyeriss, LayerMapping(channels_per_pass=2))
    assert two.detail["psum_passes"] == 128 and two.onchip_cycles == 8_306_688
    assert one.compute_cycles == two.compute_cycles == mapper.compute_cycles == 98_304 * 13 * 3
    assert one.cycles > two.cycles > mapper.cycles
    # the mapper's own choice given back is the mapper's estimate
    same = estimate(conv, eyeriss, LayerMapping(channels_per_pass=4))
    assert (same.cycles, same.sram_bytes) == (mapper.cycles, mapper.sram_bytes)


def test_given_filters_a_pass_set_the_input_rows_reread():
    """At q = 1 the mapper interleaves p = min(384, 24 partial sums, 224 // 3 weights) = 24 filters, so the buffer
    sends the 4 x 256 x 15 x 15 input rows (460,800 bytes) 16 times; p = 1 sends them 384 times."""
    eyeriss, conv = load_npu("eyeriss"), _conv3()
    mapper = estimate(conv, eyeriss, LayerMapping(channels_per_pass=1))
    one = estimate(conv, eyeriss, LayerMapping(channels_per_pass=1, filters_per_pass=1))
    assert mapper.detail["filters_per_pass"] == 24 and one.detail["filters_per_pass"] == 1
    assert one.sram_bytes - mapper.sram_bytes == 460_800 * (384 - 16)


def test_values_outside_the_scratchpads_and_the_wrong_work_are_refused():
    eyeriss, conv = load_npu("eyeriss"), _conv3()
    with pytest.raises(MappingError, match=r"m.toml: \[c\]: channels_per_pass = 5 is outside 1..4"):
        estimate(conv, eyeriss, LayerMapping(channels_per_pass=5, where="m.toml: [c]"))
    with pytest.raises(MappingError, match=r"filters_per_pass = 25 is outside 1..24"):
        estimate(conv, eyeriss, LayerMapping(channels_per_pass=1, filters_per_pass=25))
    with pytest.raises(MappingError, match="filters_per_pass = 19 is outside 1..18"):  # 224 // (4 x 3) weights
        estimate(conv, eyeriss, LayerMapping(filters_per_pass=19))
    with pytest.raises(MappingError, match="tpu-v1's weight_stationary array"):
        estimate(conv, load_npu("tpu-v1"), LayerMapping(channels_per_pass=1))
    gemm = GemmWork(64, 64, 64, Operand(64 * 64 * 2), Operand(64 * 64 * 2, constant=True), Operand(64 * 64 * 2))
    with pytest.raises(MappingError, match=r"not a convolution \(GemmWork\)"):
        estimate(gemm, eyeriss, LayerMapping(channels_per_pass=1))


def _conv_program():
    ir = export_ir(lambda: torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                                               torch.nn.Conv2d(32, 32, 3, padding=1)), [torch.empty(1, 16, 14, 14)])
    return npu_compiler.compile(ir, "cpu", dtype="float16")


def test_program_mapping_by_kernel_or_node_name_changes_only_that_kernel():
    prog, eyeriss = _conv_program(), load_npu("eyeriss")
    first, second = prog.kernels[0], prog.kernels[-1]
    base = estimate_program(prog, eyeriss)
    by_node = estimate_program(prog, eyeriss, mapping={second.nodes[0]: {"channels_per_pass": 1}})
    by_kernel = estimate_program(prog, eyeriss, mapping={second.name: LayerMapping(channels_per_pass=1)})
    assert [k.est.cycles for k in by_node.kernels] == [k.est.cycles for k in by_kernel.kernels]
    assert by_node.kernels[0].est.cycles == base.kernels[0].est.cycles
    assert by_node.kernels[-1].est.detail["psum_passes"] == 32 > base.kernels[-1].est.detail["psum_passes"]
    assert by_node.kernels[-1].est.cycles > base.kernels[-1].est.cycles
    assert any(second.name in n for n in by_node.notes)
    with pytest.raises(MappingError, match="kernel .* is mapped already"):
        estimate_program(prog, eyeriss, mapping={second.name: {"channels_per_pass": 1},
                                                 second.nodes[0]: {"channels_per_pass": 2}})
    with pytest.raises(MappingError, match=r"\[x\]: channels_per_pass must be a whole number"):
        estimate_program(prog, eyeriss, mapping={"x": {"channels_per_pass": "1"}})
    assert first.name != second.name


HOSTILE = [  # (file name, contents, what the error says besides the file's path)
    ("m.toml", "[nope]\nchannels_per_pass = 1\n", "[nope]: no kernel or node of the program is named 'nope'"),
    ("m.toml", "[{k}]\nchanels_per_pass = 1\n", "[{k}]: unknown field 'chanels_per_pass'"),
    ("m.toml", "[{k}]\nchannels_per_pass = \"2\"\n", "[{k}]: channels_per_pass must be a whole number"),
    ("m.toml", "[{k}]\nchannels_per_pass = 1.5\n", "[{k}]: channels_per_pass must be a whole number"),
    ("m.toml", "[{k}]\nfilters_per_pass = true\n", "[{k}]: filters_per_pass must be a whole number"),
    ("m.toml", "[{k}]\nchannels_per_pass = 0\n", "[{k}]: channels_per_pass must be at least 1"),
    ("m.toml", "[{k}]\nchannels_per_pass = 99\n", "[{k}]: channels_per_pass = 99 is outside 1..4"),
    ("m.toml", "[{k}]\nfilters_per_pass = 1000\n", "[{k}]: filters_per_pass = 1000 is outside 1..18"),
    ("m.toml", "[{k}]\n", "[{k}]: no field given"),
    ("m.toml", "{k} = 1\n", "[{k}]: expected a table of channels_per_pass, filters_per_pass, got int"),
    ("m.toml", "[{k}\n", "not valid TOML"),
    ("m.json", "{{\"{k}\": {{\"channels_per_pass\": -3}}}}", "[{k}]: channels_per_pass must be at least 1"),
    ("m.json", "[1, 2]", "expected a table of layers, got list"),
    ("m.json", "{{", "not valid JSON"),
    ("m.yaml", "{k}: 1", "a mapping file is .toml or .json"),
    ("m.toml", b"\xff\xfe", "not valid TOML"),
]


@pytest.mark.parametrize("name, text, says", HOSTILE)
def test_hostile_mapping_files_get_one_line_naming_the_file_and_field(tmp_path, capsys, name, text, says):
    from npusim.cli import main

    prog = _conv_program()
    art = tmp_path / "conv.npubin"
    prog.save(art)
    k = prog.kernels[-1].name
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text.format(k=k))
    assert main(["estimate", str(art), "--npu", "eyeriss", "--mapping", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"npusim estimate: error: {path}: ") and says.format(k=k) in err, err
    assert err.count("\n") == 1, err


def test_a_mapping_split_among_programs_and_hostile_names():
    """Several programs (an export-llm folder, a partitioned artifact's segments): each gets the layers it has, a
    layer two have goes to both, a name none has is refused; a name with control characters is shown escaped."""
    m = parse_mapping({"a": {"channels_per_pass": 1}, "shared": {"filters_per_pass": 2}}, "m.toml")
    split = by_program(m, {"prefill": [("k0", ["a", "shared"])], "decode": [("k1", ["shared"])]})
    assert split == {"prefill": {"a": m["a"], "shared": m["shared"]}, "decode": {"shared": m["shared"]}}
    with pytest.raises(MappingError, match=r"m.toml: \[a\]: no kernel or node of the program is named 'a'"):
        by_program(m, {"decode": [("k1", ["shared"])]})
    with pytest.raises(MappingError) as e:
        parse_mapping({"x\x1b[31m": {"channels_per_pass": 0}}, "m.toml")
    assert "\x1b" not in str(e.value) and "x\\x1b[31m" in str(e.value)


def test_missing_mapping_file_and_folder(tmp_path):
    with pytest.raises(MappingError, match="mapping file not found"):
        load_mapping(tmp_path / "none.toml")
    (tmp_path / "d.json").mkdir()
    with pytest.raises(MappingError, match="is a folder"):
        load_mapping(tmp_path / "d.json")


def test_cli_mapping_option(tmp_path, capsys):
    """--mapping FILE gives the same estimate as the API with the same mapping, TOML or JSON; without it, the
    mapper's."""
    from npusim.cli import main

    prog, eyeriss = _conv_program(), load_npu("eyeriss")
    art = tmp_path / "conv.npubin"
    prog.save(art)
    k = prog.kernels[-1].name
    (tmp_path / "m.toml").write_text(f"[{k}]\nchannels_per_pass = 1\nfilters_per_pass = 8\n")
    (tmp_path / "m.json").write_text(json.dumps({k: {"channels_per_pass": 1, "filters_per_pass": 8}}))
    api = estimate_program(prog, eyeriss, mapping={k: {"channels_per_pass": 1, "filters_per_pass": 8}})

    def cycles(*extra: str) -> float:
        assert main(["estimate", str(art), "--npu", "eyeriss", "--json", *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        return out["totals"]["cycles"], out["kernels"]

    mapped, kernels = cycles("--mapping", str(tmp_path / "m.toml"))
    assert mapped == pytest.approx(api.cycles) and cycles("--mapping", str(tmp_path / "m.json"))[0] == mapped
    given = next(x for x in kernels if x["name"] == k)["detail"]
    assert (given["channels_per_pass"], given["filters_per_pass"]) == (1, 8) and str(tmp_path) in given["mapping"]
    assert cycles()[0] == pytest.approx(estimate_program(prog, eyeriss).cycles) != mapped
