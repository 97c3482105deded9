"""A run keeps the user's tokenizer through every step (issue 24, items 1-2): a tiny Llama made by transformers with
the byte-level tokenizer (not the bundled Pythia one) and a chat template saved as transformers 5 saves it
(``chat_template.jinja``), imported, fine-tuned, evaluated, exported and generated from; a tokenizer that is not the
model's is a one-line error everywhere."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest
from builders import ROOT
from trainrun import train

from data_prep.tokenize import main as tokenize
from eval.perplexity import main as perplexity
from neox_dar.convert import main as convert
from neox_dar.generate.__main__ import main as generate
from neox_dar.rundir import newest_checkpoint, read_state
from neox_dar.tokenizer import tokenizer_sha256

BYTE = ROOT / "data" / "byte_tokenizer.json"
PYTHIA = ROOT / "data" / "20B_tokenizer.json"
FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _run(command: str, *args, expect: int = 0) -> subprocess.CompletedProcess:
    """``python -m COMMAND ARGS`` as its ``main(ARGS)`` in this process (no interpreter start-up per command): the
    exit status it returns and what it printed."""
    main = {"convert": convert, "tokenize": tokenize, "perplexity": perplexity, "generate": generate}[command]
    argv = list(map(str, args))
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    out = subprocess.CompletedProcess([command, *argv], code, stdout.getvalue(), stderr.getvalue())
    assert out.returncode == expect, f"exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def _one_line_error(out: subprocess.CompletedProcess, *words: str) -> str:
    lines = out.stderr.strip().splitlines()
    assert "Traceback" not in out.stderr and lines, out.stderr
    for word in words:
        assert word in lines[-1], lines[-1]
    return lines[-1]


@pytest.fixture(scope="module")
def byte_llama(tmp_path_factory) -> dict[str, Path]:
    """hf: the tiny Llama (vocabulary 257) with the byte tokenizer and the Tülu template, saved by transformers;
    import: its from-hf folder; data: a few C4 documents tokenized with it; run: 4 fine-tuning steps."""
    from transformers import AutoTokenizer

    from neox_dar.tiny_hf_model import tiny_hf_model, write_tokenizer_files

    root = tmp_path_factory.mktemp("byte_llama")
    hf = root / "hf"
    tiny_hf_model("llama", vocab=257).save_pretrained(hf)
    write_tokenizer_files(hf, tokenizer=BYTE)
    AutoTokenizer.from_pretrained(hf).save_pretrained(hf)  # transformers 5: the template in chat_template.jinja
    assert (hf / "chat_template.jinja").is_file()
    _run("convert", "from-hf", hf, root / "import")
    docs = root / "docs.jsonl"
    docs.write_text("".join(line for line in open(ROOT / "data" / "sample" / "c4_sample.jsonl").readlines()[:20]))
    _run("tokenize", docs, "--tokenizer", root / "import", "--out", root / "data", "--workers", "1", "--no-progress")
    train(root / "run", str(root / "data"), str(root / "import" / "model.yml"), f"load={root / 'import'}",
          "finetune=true", "train_iters=4", "checkpoint_factor=2", "eval_interval=0")
    return {"hf": hf, "import": root / "import", "run": root / "run", "root": root}


def test_run_and_checkpoints_record_the_tokenizer(byte_llama):
    """The run directory and every checkpoint hold the import's tokenizer files byte for byte (not the config's
    bundled Pythia tokenizer), listed and checksummed by the manifest, with the sha256 in the state."""
    imp, run = byte_llama["import"], byte_llama["run"]
    for name in FILES:
        assert (run / "tokenizer" / name).read_bytes() == (imp / name).read_bytes(), name
    steps = sorted((run / "checkpoints").glob("step_*"))
    assert len(steps) == 2
    for step in steps:
        state = read_state(step)
        assert state["tokenizer_sha256"] == tokenizer_sha256(imp / "tokenizer.json") != tokenizer_sha256(PYTHIA)
        for name in FILES:
            assert (step / name).read_bytes() == (imp / name).read_bytes(), name
            assert name in state["files"]


def test_commands_use_the_checkpoints_tokenizer(byte_llama, tmp_path):
    """eval.perplexity scores with the byte tokenizer (one token per byte: it crashed with IndexError when it fell
    back to Pythia's), lm-eval's model loads it, and the export ships it and its chat template byte for byte;
    transformers' tokenizer of the export renders the chat as the original model's does."""
    from transformers import AutoTokenizer

    from eval.lm_eval_model import NeoxDarLM

    run, imp = byte_llama["run"], byte_llama["import"]
    _run("perplexity", run, "--corpora", "c4", "--max-docs", "2", "--no-progress", "--no-wandb", "--out",
         tmp_path / "ppl.json")
    c4 = json.loads((tmp_path / "ppl.json").read_text())["corpora"]["c4"]
    assert c4["tokens"] == c4["bytes"]
    assert len(NeoxDarLM(checkpoint=str(run)).tokenizer) == 257  # 256 bytes + <|endoftext|>
    _run("convert", "to-hf", run, tmp_path / "export")
    for name in FILES:
        assert (tmp_path / "export" / name).read_bytes() == (imp / name).read_bytes(), name
    chat = [{"role": "user", "content": "Hello?"}]
    theirs = AutoTokenizer.from_pretrained(byte_llama["hf"])
    ours = AutoTokenizer.from_pretrained(tmp_path / "export", trust_remote_code=False)
    assert ours.apply_chat_template(chat, add_generation_prompt=True) == \
        theirs.apply_chat_template(chat, add_generation_prompt=True)


def test_generate_chat_applies_the_checkpoints_template(byte_llama, tmp_path):
    """generate --chat renders each prompt as a user turn with the generation prompt of the checkpoint's template
    (the Tülu template: '<|user|>\\nHi\\n<|assistant|>\\n') and decodes from its ids; the same prompt without
    --chat is decoded from the bare text."""
    for flags, expected in ((["--chat"], "<|user|>\nHi\n<|assistant|>\n"), ([], None)):
        out = tmp_path / "out.jsonl"
        _run("generate", byte_llama["run"], "--prompts", _prompts(tmp_path, "Hi"), *flags, "--max-new-tokens", "2",
             "--out", out)
        line = json.loads(out.read_text())
        assert line.get("chat_prompt") == expected


def _prompts(tmp_path: Path, *prompts: str) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def test_a_tokenizer_that_is_not_the_models_is_refused(byte_llama, tmp_path):
    """--tokenizer with another file than the checkpoint's, a vocab_file that differs from load='s tokenizer, and
    a tokenizer larger than the embedding: one line each, exit 2."""
    run, imp = byte_llama["run"], byte_llama["import"]
    for cmd in (["perplexity", run, "--corpora", "c4", "--max-docs", "1", "--no-wandb", "--tokenizer", PYTHIA],
                ["convert", "to-hf", run, tmp_path / "x", "--tokenizer", PYTHIA],
                ["generate", run, "--prompt", "a", "--max-new-tokens", "1", "--tokenizer", PYTHIA]):
        _one_line_error(_run(*cmd, expect=2), "not the tokenizer", str(PYTHIA))
    out = train(tmp_path / "other", str(byte_llama["root"] / "data"), str(imp / "model.yml"), f"load={imp}",
                "finetune=true", f"vocab_file={PYTHIA}", expect=2)
    _one_line_error(out, f"vocab_file {PYTHIA} is not the tokenizer", "not the tokenizer")  # the path once
    out = train(tmp_path / "scratch", str(byte_llama["root"] / "data"), "vocab_size=257", expect=2)
    _one_line_error(out, "ids up to 50276", "384 embedding rows")
    assert newest_checkpoint(tmp_path / "scratch") is None
