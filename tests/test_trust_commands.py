"""The commands around training as a user runs them (issue 36, items 8-10): evaluation and export of a run while its
trainer prunes, interrupts and hostile input that end in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from builders import ROOT, saved_model

from neox_dar.rundir import TMP_PREFIX, prune, publish, step_dir_name, write_manifest


def _run_being_pruned(run: Path, monkeypatch) -> Path:
    """A run directory with one checkpoint (step 7: a tiny model and its tokenizer), and the trainer simulated at the
    worst moment: just as a command starts reading the weights, step 8 is published and the run prunes to one
    checkpoint (keep_last_n=1). Returns step 7's directory."""
    import neox_dar.saved_model as saved

    root = run / "checkpoints"
    step7 = root / step_dir_name(7)
    step7.mkdir(parents=True)
    shutil.copy(ROOT / "data" / "20B_tokenizer.json", step7 / "tokenizer.json")
    saved_model(step7, "seq_length=32")
    write_manifest(step7, {"step": 7})
    real_load = saved.load_file

    def load_while_training(path, device="cpu"):
        if not (root / step_dir_name(8)).exists():
            tmp = root / (TMP_PREFIX + step_dir_name(8))
            shutil.copytree(step7, tmp)
            write_manifest(tmp, {"step": 8})
            publish(tmp, root / step_dir_name(8))
            prune(root, 1)
        return real_load(path, device=device)

    monkeypatch.setattr(saved, "load_file", load_while_training)
    return step7


@pytest.mark.parametrize("command", ["eval.perplexity", "convert to-hf", "generate"])
def test_a_checkpoint_pruned_while_it_is_read_is_read_whole(command, tmp_path, monkeypatch, capsys):
    """eval.perplexity, convert to-hf and generate of a run whose trainer publishes a newer checkpoint and prunes the
    one being read: the command reads its checkpoint whole (weights and tokenizer) and completes; the prune leaves
    the held checkpoint for the next one. (Before: "not a readable safetensors file" or "tokenizer file not
    found".)"""
    run = tmp_path / "run"
    step7 = _run_being_pruned(run, monkeypatch)
    if command == "eval.perplexity":
        from eval.perplexity import main

        out = tmp_path / "ppl.json"
        assert main([str(run), "--corpora", "c4", "--max-docs", "1", "--no-progress", "--no-wandb",
                     "--out", str(out)]) == 0, capsys.readouterr().err
        assert json.loads(out.read_text())["step"] == 7
    elif command == "convert to-hf":
        from neox_dar.convert import main

        assert main(["to-hf", str(run), str(tmp_path / "hf")]) == 0, capsys.readouterr().err
        assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (ROOT / "data" / "20B_tokenizer.json").read_bytes()
    else:
        from neox_dar.generate.__main__ import main

        assert main([str(run), "--prompt", "The", "--max-new-tokens", "2", "--device", "cpu"]) == 0, \
            capsys.readouterr().err
    assert step7.is_dir() and (run / "checkpoints" / step_dir_name(8)).is_dir()
    assert prune(run / "checkpoints", 1) == [step7]


def _one_line(err: str, start: str) -> str:
    """The one line a command printed on stderr, which starts with ``start``; no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len([line for line in lines if line.startswith(start)]) == 1, err
    return next(line for line in lines if line.startswith(start))


def _ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt


def _interrupted(main, argv: list[str]) -> int:
    """``main(argv)``'s exit status, with Ctrl-C simulated inside it; a KeyboardInterrupt it lets out (a
    traceback for the user) fails the test instead of stopping pytest."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt came out of the command (a traceback)")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_ctrl_c_in_eval_convert_and_tokenize_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """Ctrl-C while eval.perplexity scores, while convert to-hf writes over an earlier export, and while
    data_prep.tokenize merges over an earlier set: each prints one line and exits 130; the earlier outputs are byte
    for byte as they were, nothing is left beside them, and the tokenize run, started again, continues from its
    shards. (Before: a KeyboardInterrupt traceback each.)"""
    import data_prep.tokenize as tokenize
    import neox_dar.evaluation.cli as perplexity
    import neox_dar.convert as convert
    import neox_dar.hf.folders as folders

    run = tmp_path / "run"
    saved_model(run / "checkpoints" / step_dir_name(7), "seq_length=32")
    write_manifest(run / "checkpoints" / step_dir_name(7), {"step": 7})
    monkeypatch.setattr(perplexity, "score_corpus", _ctrl_c)
    assert _interrupted(perplexity.main, [str(run), "--corpora", "c4", "--max-docs", "1", "--no-progress",
                                          "--no-wandb", "--out", str(tmp_path / "ppl.json")]) == 130
    assert _one_line(capsys.readouterr().err, "error:") == "error: interrupted (Ctrl-C): nothing was written"
    assert not (tmp_path / "ppl.json").exists()

    hf = tmp_path / "hf"
    assert convert.main(["to-hf", str(run), str(hf)]) == 0
    before = _files(hf)
    monkeypatch.setattr(folders, "save_safetensors", _ctrl_c)
    assert _interrupted(convert.main, ["to-hf", str(run), str(hf)]) == 130
    assert _one_line(capsys.readouterr().err, "convert") == f"convert: interrupted (Ctrl-C): {hf} is as it was"
    assert _files(hf) == before and sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]

    prefix = tmp_path / "data" / "c4"
    argv = [str(ROOT / "data" / "sample" / "c4_sample.jsonl"), "--tokenizer", str(ROOT / "data" / "20B_tokenizer.json"),
            "--out", str(prefix), "--workers", "1", "--no-progress"]
    assert tokenize.main([*argv, "--max-tokens", "2000"]) == 0
    earlier = _files(prefix.parent)
    real_merge = tokenize.merge_shards

    def merge_then_ctrl_c(*args):
        real_merge(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(tokenize, "merge_shards", merge_then_ctrl_c)
    assert _interrupted(tokenize.main, [*argv, "--max-tokens", "3000"]) == 130
    assert _one_line(capsys.readouterr().err, "data_prep.tokenize") == (
        "data_prep.tokenize: interrupted (Ctrl-C): the outputs are as they were; the finished shards are kept, so the "
        "same command continues from them")
    assert {k: v for k, v in _files(prefix.parent).items() if not k.startswith("c4.shards")} == earlier
    monkeypatch.setattr(tokenize, "merge_shards", real_merge)
    assert tokenize.main([*argv, "--max-tokens", "3000"]) == 0
    assert json.loads(Path(f"{prefix}.manifest.json").read_text())["shards_resumed"] == 1


def test_a_long_save_name_infinite_blend_weights_and_a_yaml_tag_are_one_line(tmp_path, capsys):
    """train.py with a 300-character save name, with blend weights [1, .inf] and [1e308, 1e308] (their sum
    overflows), and convert from-hf with a YAML tag in an override: one line each, exit 2, nothing written.
    (Before: an OSError traceback, a NaN traceback from the blend, and a ConstructorError traceback.)"""
    import train
    from builders import hf_folder

    from neox_dar.convert import main as convert_main

    base = [str(ROOT / "configs" / "tiny.yml"), f"data_path={tmp_path / 'c4'}"]
    assert train.main([*base, f"save={tmp_path / ('x' * 300)}"]) == 2
    line = _one_line(capsys.readouterr().err, "config error:")
    assert line.startswith(f"config error: save={tmp_path}/xxx") and line.endswith(
        "cannot be a directory here: File name too long")
    for weights, why in (("[1, .inf]", "'train_data_weights[1]' in the command line: inf (must be a finite number)"),
                         ("[1e308, 1e308]", "(must be non-negative, with a positive and finite sum)")):
        blend = ["data_path=null", f"train_data_paths=[{tmp_path / 'a'}, {tmp_path / 'b'}]"]
        assert train.main([*base, *blend, f"train_data_weights={weights}", f"save={tmp_path / 'run'}"]) == 2
        assert _one_line(capsys.readouterr().err, "config error:").endswith(why)
    hf_folder(tmp_path / "hf", "llama")
    assert convert_main(["from-hf", str(tmp_path / "hf"), str(tmp_path / "imported"),
                         "attention_type=!!python/object/apply:os.system [echo planted]"]) == 2
    assert "invalid value for 'attention_type' in the command line" in _one_line(capsys.readouterr().err,
                                                                                   "convert error:")
    (tmp_path / "afile").write_text("x")
    assert convert_main(["from-hf", str(tmp_path / "hf"), str(tmp_path / "afile" / "sub")]) == 2  # a staging error
    assert _one_line(capsys.readouterr().err, "convert error:").endswith(f"{tmp_path / 'afile'} is a file, not a folder")
    (tmp_path / "afile").unlink()
    for override, said in (("window_size=-3", "invalid value for 'window_size' in the command line: -3"),
                           ("no_such_key=1", "unknown key 'no_such_key' in the command line")):  # said config.json
        assert convert_main(["from-hf", str(tmp_path / "hf"), str(tmp_path / "imported"), override]) == 2
        assert said in _one_line(capsys.readouterr().err, "convert error:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0]['content'] }}"
SANDBOXED = "{{ ''.__class__.__mro__[1].__subclasses__() }}"


def test_hostile_chat_templates_are_one_line_in_generate_and_data_prep_chat(tmp_path, monkeypatch, capsys):
    """generate --chat and data_prep.chat with a template of nested range(100000) loops (10^10 iterations), and
    generate --chat with one the sandbox refuses: one line each, exit 2, within the render bound (0.5 s here).
    (Before: generate hung at 100% CPU, and the refused template was a SecurityError traceback.)"""
    import neox_dar.chat_render as chat_render
    from data_prep.chat import main as chat_main
    from neox_dar.generate.__main__ import main as generate_main

    monkeypatch.setattr(chat_render, "RENDER_SECONDS", 0.5)
    tok = tmp_path / "tok"
    tok.mkdir()
    shutil.copy(ROOT / "data" / "20B_tokenizer.json", tok / "tokenizer.json")
    step = tmp_path / "run" / "checkpoints" / step_dir_name(7)
    saved_model(step, "seq_length=32")
    write_manifest(step, {"step": 7})
    timeout = "the chat template was still rendering after 0.5 s (a loop longer than any conversation needs)"
    for template, expected in ((LOOPS, timeout), (SANDBOXED, "the chat template cannot render this conversation "
                                                              "(SecurityError: access to attribute '__class__'")):
        (tok / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                               "chat_template": template}))
        assert generate_main([str(step), "--prompt", "hi", "--max-new-tokens", "1", "--chat", "--tokenizer",
                              str(tok / "tokenizer.json")]) == 2
        assert _one_line(capsys.readouterr().err, "error:").startswith(f"error: {expected}")
    (tok / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "chat_template": LOOPS}))
    assert chat_main([str(ROOT / "data" / "sample" / "chat_sample.jsonl"), "--tokenizer", str(tok), "--out",
                      str(tmp_path / "sft"), "--workers", "1", "--no-progress"]) == 2
    assert _one_line(capsys.readouterr().err, "data_prep.chat:").startswith(f"data_prep.chat: error: {timeout}")
    assert not list(tmp_path.glob("sft*"))
