"""The byte-level tokenizer: a text's UTF-8 bytes are its token ids (256 symbols, no merges), plus ``<|endoftext|>``
(id 256) as the document separator and rolling-window prefix every neox-dar model uses.

    python -m data_prep.byte_tokenizer [--out data/byte_tokenizer.json]

It is an ordinary Hugging Face ``tokenizer.json``, so ``data_prep.tokenize --tokenizer data/byte_tokenizer.json``,
training (``vocab_file: data/byte_tokenizer.json``, ``vocab_size: 257``), evaluation, ``convert to-hf`` and
lm-evaluation-harness read it like any other: a BPE model whose vocabulary is the 256 tokens ``<0x00>`` ..
``<0xFF>`` (id = byte value) with no merges and byte fallback, so every character falls back to its UTF-8 bytes;
the byte-fallback decoder turns ids back into the text. The repository ships the file this command writes
(a test keeps the two equal).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models

EOD_TOKEN = "<|endoftext|>"
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "data" / "byte_tokenizer.json"


def build() -> Tokenizer:
    """The byte-level tokenizer: ids 0..255 are the bytes, 256 is ``<|endoftext|>``."""
    tok = Tokenizer(models.BPE(vocab={f"<0x{b:02X}>": b for b in range(256)}, merges=[], byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(EOD_TOKEN, special=True, normalized=False)])
    return tok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_prep.byte_tokenizer", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DEFAULT_PATH), help="where to write tokenizer.json (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        build().save(args.out)
    except Exception as e:  # noqa: BLE001  (tokenizers reports a failed write as a plain Exception)
        print(f"data_prep.byte_tokenizer: error: cannot write {args.out}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: 257 tokens (256 bytes + {EOD_TOKEN})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
