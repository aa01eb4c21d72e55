"""A model folder's chat template is untrusted text: it renders in jinja2's immutable sandbox (as transformers
renders it), so a template that reaches for Python's internals is refused and nothing it names is run."""

from __future__ import annotations

import json

import pytest

from npu_runtime.errors import InputError
from npu_runtime.tokenizer import TemplateSecurityError, Tokenizer, render_chat_template

pytest.importorskip("jinja2")
pytest.importorskip("tokenizers")

# Each tries to run `touch CANARY` (or write through a mutable object) from inside the template.
ATTACKS = {
    "cycler_globals": "{{ cycler.__init__.__globals__.os.system('touch CANARY') }}",
    "joiner_globals": "{{ joiner.__init__.__globals__.os.popen('touch CANARY').read() }}",
    "lipsum_globals": "{{ lipsum.__globals__['os'].system('touch CANARY') }}",
    "subclasses": "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
                  "{{ c(['touch', 'CANARY']) }}{% endif %}{% endfor %}",
    "namespace_dunder": "{% set ns = namespace(__init__=1) %}{{ ns }}",
    "namespace_setattr": "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "dict_class": "{{ dict.__class__.__init__.__globals__ }}",
    "raise_exception_globals": "{{ raise_exception.__globals__['os'].system('touch CANARY') }}",
    "format_string": "{{ '{0.__class__.__init__.__globals__}'.format(cycler) }}",
    "mutate_messages": "{{ messages.append({'role': 'system', 'content': 'x'}) }}",
    "mutate_dict": "{{ messages[0].update({'content': 'x'}) }}",
}


@pytest.fixture
def model_folder(tmp_path, monkeypatch):
    """A folder with a word-level tokenizer.json; the test writes the template. The working directory is a fresh
    folder, where a template that ran `touch CANARY` would leave its file."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    tok = HFTokenizer(models.WordLevel({f"w{i}": i for i in range(16)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


@pytest.mark.parametrize("template", list(ATTACKS.values()), ids=list(ATTACKS))
def test_a_template_that_reaches_for_python_is_refused(model_folder, template):
    (model_folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tok = Tokenizer.from_dir(model_folder)
    with pytest.raises(InputError) as err:
        tok.encode("w1 w2", chat=True)
    assert "tokenizer_config.json" in str(err.value)
    assert not (model_folder / "cwd" / "CANARY").exists()


def test_the_attack_names_the_sandbox(model_folder):
    (model_folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": ATTACKS["cycler_globals"]}))
    with pytest.raises(TemplateSecurityError, match="sandbox forbids"):
        Tokenizer.from_dir(model_folder).encode("w1", chat=True)


def test_chat_template_jinja_file_wins_and_is_sandboxed(model_folder):
    (model_folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "w1 {{ messages[0].content }}"}))
    (model_folder / "chat_template.jinja").write_text(ATTACKS["cycler_globals"])
    with pytest.raises(TemplateSecurityError, match="chat_template.jinja"):
        Tokenizer.from_dir(model_folder).encode("w1", chat=True)
    assert not (model_folder / "cwd" / "CANARY").exists()


def test_what_real_templates_use_still_works(model_folder):
    """The helpers transformers gives templates: raise_exception, strftime_now, tojson without HTML escaping,
    namespace, loop controls; a named template list's "default"."""
    template = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                "{% set ns.n = ns.n + 1 %}w1 {{ m['content'] }}{% endfor %} {{ ns.n }} {{ '<a>' | tojson }} "
                "{{ strftime_now('%Y')[:2] }}{% if add_generation_prompt %} w3{% endif %}")
    (model_folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]}))
    tok = Tokenizer.from_dir(model_folder)
    text = tok.apply_chat_template("w5")
    assert text.startswith("w1 w5 1 \"<a>\" ") and text.endswith(" w3")
    assert text.split()[-2].isdigit()  # the century from strftime_now


def test_raise_exception_is_the_templates_own_error(model_folder):
    (model_folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ raise_exception('only user and assistant roles') }}"}))
    with pytest.raises(InputError, match="cannot be rendered: TemplateError: only user and assistant roles"):
        Tokenizer.from_dir(model_folder).encode("w1", chat=True)


def test_no_template_warns_and_encodes_plain_text(model_folder):
    from npu_compiler.errors import NPUSimWarning

    with pytest.warns(NPUSimWarning, match="no chat template"):
        assert Tokenizer.from_dir(model_folder).encode("w4 w5", chat=True) == [4, 5]


def test_render_directly_refuses_an_escape():
    with pytest.raises(TemplateSecurityError):
        render_chat_template(ATTACKS["subclasses"], [{"role": "user", "content": "x"}])


# ---- the code itself: nothing reads code from a file it is given ----------------------------------------------------

PACKAGES = ("npu_compiler", "npu_runtime", "npu_export", "npusim")
# importlib with a name that is not a literal, each for a reason: a registry of the project's own modules, or the
# user's own code named on the command line (`npusim export MODULE:FACTORY`, which is what that command is for).
DYNAMIC_IMPORTS = {
    "npu_compiler/targets/codegen.py": "TARGET_MODULES, the project's own target modules",
    "npu_runtime/backend.py": "BACKEND_MODULES, the project's own backend modules",
    "npu_export/__init__.py": "_EXPORTS, the package's own submodules",
    "npu_export/model_ref.py": "the module the user names in `npusim export MODULE:FACTORY`",
    "npusim/cli.py": "COMMANDS, the CLI's own command modules",
}


def _calls(tree):
    import ast

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            yield node, owner if isinstance(f, ast.Attribute) else None, name


def _kw(call, name):
    import ast

    for k in call.keywords:
        if k.arg == name and isinstance(k.value, ast.Constant):
            return k.value.value
    return None


def test_no_module_executes_or_imports_what_a_file_names():
    """The audit as a test: no pickle or marshal, no eval/exec/compile of text, torch.load only with
    weights_only=True, np.load only with allow_pickle=False, and importlib only from the registries above."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    problems = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    mods = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                    if any(m and m.split(".")[0] in ("pickle", "marshal", "shelve", "dill", "cloudpickle")
                           for m in mods):
                        problems.append(f"{rel}:{node.lineno}: imports a pickle-like module")
            for call, owner, name in _calls(tree):
                where = f"{rel}:{call.lineno}"
                literal = bool(call.args) and isinstance(call.args[0], ast.Constant)
                if owner is None and name in ("eval", "exec", "compile") or name == "__import__" and not literal:
                    problems.append(f"{where}: {name}()")
                if owner == "torch" and name == "load" and _kw(call, "weights_only") is not True:
                    problems.append(f"{where}: torch.load without weights_only=True")
                if owner in ("np", "numpy") and name == "load" and _kw(call, "allow_pickle") is not False:
                    problems.append(f"{where}: np.load without allow_pickle=False")
                if name in ("import_module", "spec_from_file_location", "exec_module") and rel not in DYNAMIC_IMPORTS:
                    if not literal:
                        problems.append(f"{where}: {name} of a name that is not a literal")
    assert not problems, "\n".join(problems)


def test_the_cpu_fallback_runs_only_registered_aten_ops(tmp_path, capsys):
    """An IR whose op names a Python attribute path instead of an ATen operator reaches the CPU fallback (no
    lowering knows it) and is refused there before torch_ir resolves it by attribute lookups."""
    import sys

    from safetensors.numpy import save_file

    from npusim.cli import main

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from test_hardening import small_ir, small_weights

    save_file(small_weights(), str(tmp_path / "w.safetensors"))
    for op in ("aten.__class__.__init__", "aten.relu.__class__", "builtins.eval"):
        ir = small_ir()
        ir["nodes"][1]["op_type"] = op
        (tmp_path / "m.json").write_text(json.dumps(ir))
        assert main(["verify", str(tmp_path / "m.json"), "--weights", str(tmp_path / "w.safetensors")]) == 1
        err = capsys.readouterr().err
        assert "not an ATen op" in err and op in err and err.count("error:") == 1, err


def test_torch_names_in_attributes_come_from_a_table():
    import torch

    from npu_runtime.errors import NPURuntimeError
    from npu_runtime.fallback import _to_torch_attr

    assert _to_torch_attr("torch.float16", "ScalarType", None, "a") is torch.float16
    assert _to_torch_attr("channels_last", "MemoryFormat", None, "a") is torch.channels_last
    for name in ("torch.load", "_dynamo", "torch.nn", "float16.__class__"):
        with pytest.raises(NPURuntimeError, match="is not a torch ScalarType"):
            _to_torch_attr(name, "ScalarType", None, "a")
