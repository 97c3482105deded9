"""Hostile records of the data preparation commands: each is a bad record with its reason, never a traceback."""

import pytest

from data_prep.encode import BadRecord, decode_record


@pytest.mark.parametrize("payload, reason", [
    (b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "malformed JSON: nested too deeply"),
    (b'{"text": "\\ud800 x"}', "invalid Unicode (lone surrogate escape)"),
    (b'{"text": "caf\xe9"}', "invalid UTF-8: byte 0xe9 at offset 13"),
], ids=["nested", "surrogate", "utf8"])
def test_tokenize_records_nested_too_deeply_or_not_unicode_are_bad_records(payload, reason):
    with pytest.raises(BadRecord) as e:
        decode_record("json", payload, "text")
    assert str(e.value) == reason
