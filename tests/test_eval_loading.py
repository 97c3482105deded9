"""Which tokenizer evaluation uses: never a silent substitute for the one a checkpoint names."""

import pytest

from neox_dar.config import load_config
from neox_dar.tokenizer import TokenizerError, load_tokenizer


def test_config_vocab_file_is_used():
    tok = load_tokenizer(load_config(overrides=["vocab_file=data/20B_tokenizer.json"]).model)
    assert tok.token_to_id("<|endoftext|>") == 0


def test_missing_vocab_file_is_an_error_not_the_bundled_tokenizer(tmp_path):
    with pytest.raises(TokenizerError, match="vocab_file .* was not found"):
        load_tokenizer(load_config(overrides=[f"vocab_file={tmp_path / 'other.json'}"]).model)


def test_sentencepiece_checkpoints_need_an_explicit_tokenizer():
    with pytest.raises(ValueError, match="tokenizer_type 'SPMTokenizer'"):
        load_tokenizer(load_config(overrides=["tokenizer_type=SPMTokenizer"]).model)
