"""The README and the user guides run as written, their Korean editions run the same code, and what the docs say
of the tolerances and the install is what the code does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_runner import blocks, check_quotes, normalized, run_guide

REPO = Path(__file__).resolve().parent.parent
GUIDES = ["compile-your-own-model.md", "bring-your-own-checkpoint.md", "read-a-profile.md",
          "bisect-a-numerical-bug.md"]
TRANSLATED = GUIDES + ["quantization.md"]  # pages with a Korean edition
PAIRS = [(REPO / "README.md", REPO / "README.ko.md")] + [(REPO / "docs" / g, REPO / "docs" / "ko" / g)
                                                         for g in TRANSLATED]


@pytest.mark.parametrize("doc", [REPO / "README.md"] + [REPO / "docs" / g for g in GUIDES], ids=lambda p: p.name)
def test_runs_as_written(doc, tmp_path, monkeypatch):
    monkeypatch.setenv("NPUSIM_BACKEND", "cpu")  # the same numbers on a machine with a GPU
    results = run_guide(doc, tmp_path)
    ran = [r for r in results if r.command.startswith("npusim ")]
    assert len(ran) >= 5, f"{doc.name}: only {len(ran)} npusim commands ran"
    problems = check_quotes(doc, results)  # the output a guide quotes is what the tools print (numbers aside)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("en, ko", PAIRS, ids=lambda p: str(p.relative_to(REPO)))
def test_korean_edition_runs_the_same_code(en, ko):
    assert ko.is_file(), f"{ko.relative_to(REPO)} is missing"
    assert normalized(ko) == normalized(en), f"{ko.relative_to(REPO)} is out of step with {en.relative_to(REPO)}"
    # the translation links to the Korean guides where the English one links to the English ones
    en_links = re.findall(r"\]\(([^)]+\.md)\)", en.read_text())
    ko_links = re.findall(r"\]\(([^)]+\.md)\)", ko.read_text())
    assert len(ko_links) >= len(en_links) - 1, (en_links, ko_links)


def test_readme_keeps_the_fresh_machine_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    first = [b for b in blocks(REPO / "README.md") if b.lang == "bash"][0]
    assert first.skip and first.code.splitlines() == [
        'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && npusim demo',
        'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && python -m pytest -q',
    ]
    assert lines[0] == "# NPU Simulation"


def test_no_links_into_a_folder_a_clone_lacks():
    for path in [REPO / "README.md", REPO / "README.ko.md", REPO / "pyproject.toml",
                 *(REPO / "docs").glob("*.md"), *(REPO / "docs" / "ko").glob("*.md")]:
        text = path.read_text()
        assert "../shared" not in text and "ENVIRONMENT.md" not in text, path.name
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if "://" not in target:
                assert (path.parent / target).exists(), f"{path.name} links to a missing {target}"


def test_cuda_extra_installs_cupy_for_the_pinned_cuda_line():
    text = (REPO / "pyproject.toml").read_text()
    extra = re.search(r"^cuda = \[(.*?)^\]", text, re.S | re.M)
    assert extra, "no cuda extra"
    assert "cupy-cuda13x" in extra.group(1) and "cuda-build" in extra.group(1)
    pins = re.findall(r'"nvidia-cuda-nvrtc==(\d+)\.', text)
    assert pins == ["13"], "the CuPy build must match the NVRTC major"
    readme = (REPO / "README.md").read_text()
    assert 'pip install -e ".[dev,cuda]"' in readme and "CUDA 13" in readme


def test_tolerance_doc_matches_what_verify_applies():
    from npu_runtime.metrics import MODEL_TOLERANCE

    text = (REPO / "docs" / "tolerances.md").read_text()
    section = text.split("## What `npusim verify` applies", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (float32|float16|bfloat16|int8) \| ([0-9.e-]+) \| ([0-9.e-]+) \| ([0-9.e-]+) \|", section,
                      re.M)
    assert {dt: (float(r), float(m), float(a)) for dt, r, m, a in rows} == {
        dt: (t["min_r"], t["max_rel"], t["atol"]) for dt, t in MODEL_TOLERANCE.items()}
    # the verify --help states the same defaults
    from npusim.cli import build_parser

    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices and "verify" in a.choices)
    help_text = " ".join(sub.choices["verify"].format_help().split())
    for dt, t in MODEL_TOLERANCE.items():
        assert f"{dt}: pearson >= {t['min_r']:g}, max|err|/max|ref| <= {t['max_rel']:g}" in help_text, dt


def test_guides_are_listed_in_both_readmes():
    for readme, prefix in ((REPO / "README.md", "docs/"), (REPO / "README.ko.md", "docs/ko/")):
        text = readme.read_text()
        for g in GUIDES:
            assert f"({prefix}{g})" in text, (readme.name, g)


def test_runner_sees_exit_markers_and_marks():
    from doc_runner import commands

    assert commands("npusim verify a.json   # exit 1\nnpusim run x \\\n  --iters 2\n# a comment\n") == [
        ("npusim verify a.json", 1), ("npusim run x --iters 2", 0)]


def test_output_quotes_are_checked_numbers_aside():
    from doc_runner import check_output, refreshed

    out = ("profile m on cpu: 3 kernels\n"
           "   # kernel  group  time(us)      %    MB   MFLOP\n"
           "   1 k1_pool pool.default   764.1   11.6  0.041   0.037\n")
    assert check_output("   1 k1_pool pool.default   12.0   1.6  0.041   0.037\n", out) == []
    # the exact columns must be as printed; the timing ones need not
    quote = "   # kernel  group  time(us)      %    MB   MFLOP\n   1 k1_pool pool.default   9.0   1.0  0.041   1.180\n"
    assert check_output(quote, out, "exact=MB,MFLOP") == ["   1 k1_pool pool.default   9.0   1.0  0.041   1.180"]
    assert check_output("profile m on cpu: 3 kernels, 5 runs\n", out) == ["profile m on cpu: 3 kernels, 5 runs"]
    text, left = refreshed("   1 k1_pool pool.default   9.0   1.0  0.041   1.180\n...\n", out)
    assert text.splitlines() == [out.splitlines()[2], "..."] and not left


@pytest.mark.parametrize("readme", ["README.md", "README.ko.md"])
def test_readme_says_what_it_is_then_the_two_commands_and_keeps_performance_short(readme):
    """What it is and for whom (one short paragraph) comes before the two commands; the performance section is a table
    and a few lines of method (the details are bench/README.md's)."""
    lines = (REPO / readme).read_text().splitlines()
    first_fence = lines.index("```bash")
    intro = [ln for ln in lines[1:first_fence] if ln.strip() and not ln.startswith("<!--")]
    assert 3 <= len(intro) <= 12 and not any(ln.startswith(("#", "|", "-")) for ln in intro), intro
    start = next(i for i, ln in enumerate(lines) if ln.startswith("## ") and ("Performance" in ln or "성능" in ln))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    section = [ln for ln in lines[start + 1:end] if ln.strip()]
    assert len(section) <= 15, f"{readme}: the performance section has {len(section)} lines"
    assert len(set(re.findall(r"\b[0-9a-f]{7}\b", "\n".join(section)))) <= 1, "one pass, one commit"
    assert "bench/README.md" in "\n".join(section)
