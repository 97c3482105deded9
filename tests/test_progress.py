"""progress_bar: tqdm's bar on a terminal; on anything else (a SLURM log, a file, a pipe) whole lines at a fixed
interval and one at the end, never a carriage return (issue 28 item 7)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from tqdm import tqdm

import neox_dar.progress as progress
from neox_dar.progress import LogProgress, progress_bar


class Clock:
    """A stand-in for time.monotonic that moves only when told."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(progress, "monotonic", c)
    return c


def lines(stream: io.StringIO) -> list[str]:
    text = stream.getvalue()
    assert "\r" not in text and (text == "" or text.endswith("\n"))
    return text.splitlines()


def test_a_line_every_interval_and_one_at_the_end(clock):
    out = io.StringIO()
    with progress_bar(total=100, desc="scoring", unit="tok", file=out) as bar:
        assert isinstance(bar, LogProgress)
        for step in range(10):
            clock.now += 7.0  # 10 updates over 70 s: lines at 35 s and 70 s (every 30 s or more)
            bar.update(10)
            bar.set_postfix(docs=f"{step + 1}/10")
    got = lines(out)
    assert len(got) == 3, got
    assert got[0].startswith("scoring:  50%|") and "50/100 [00:35<" in got[0] and "docs=4/10" in got[0]
    assert got[1].startswith("scoring: 100%|") and "100/100" in got[1]
    assert got[2].startswith("scoring: 100%|") and "docs=10/10" in got[2]  # the final line on close


def test_a_fast_bar_writes_only_its_final_line(clock):
    out = io.StringIO()
    bar = progress_bar(total=3, desc="fast", file=out)
    bar.update(2)
    bar.update()
    bar.close()
    bar.close()  # a second close writes nothing
    (line,) = lines(out)
    assert line.startswith("fast: 100%|") and "3/3" in line


def test_iterable_unknown_total_postfix_str(clock):
    out = io.StringIO()
    seen = []
    for i in progress_bar(iterable=range(4), desc="docs", file=out, mininterval=0):  # a line per update
        seen.append(i)
    assert seen == [0, 1, 2, 3]
    got = lines(out)
    assert len(got) == 5 and got[-1].startswith("docs: 100%|") and "4/4" in got[-1]
    out = io.StringIO()
    bar = progress_bar(desc="bytes", unit="B", unit_scale=True, file=out, smoothing=0.1)
    bar.update(2048)
    bar.set_postfix_str("12 docs/s", refresh=False)
    bar.close()
    (line,) = lines(out)
    assert line.startswith("bytes: 2.05kB [") and line.endswith("12 docs/s]")


def test_transient_and_disabled_bars_write_nothing(clock):
    out = io.StringIO()
    with progress_bar(total=5, leave=False, file=out) as bar:  # short and transient: leaves no line
        bar.update(5)
    with progress_bar(total=5, disable=True, file=out, mininterval=0) as bar:
        bar.update(5)
    assert out.getvalue() == ""
    with progress_bar(total=5, leave=False, file=out) as bar:  # a transient bar that has logged ends its story
        clock.now += 31
        bar.update(1)
    assert len(lines(out)) == 2


def test_a_bar_closed_within_its_delay_writes_nothing(clock):
    """tqdm's ``delay``: work that ends sooner shows no bar (the data check's token scan of a small file); longer
    work shows its final line."""
    out = io.StringIO()
    with progress_bar(total=5, delay=2.0, file=out) as bar:
        clock.now += 1.5
        bar.update(5)
    assert out.getvalue() == ""
    with progress_bar(total=5, delay=2.0, file=out) as bar:
        clock.now += 2.5
        bar.update(5)
    (line,) = lines(out)
    assert "5/5" in line


def test_terminal_gets_tqdm_and_unknown_arguments_are_refused():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = progress_bar(total=2, file=Terminal())
    assert isinstance(bar, tqdm) and bar.mininterval == 0.1
    bar.close()
    with pytest.raises(TypeError, match="unknown argument.*totl"):
        progress_bar(totl=2, file=io.StringIO())


def test_rolling_evaluation_logs_lines(capsys, monkeypatch):
    """A user of progress_bar writing to stderr that is not a terminal (pytest captures it): lines, no '\\r'."""
    import torch

    from neox_dar.evaluation.scoring import score_documents

    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.0)  # a line at every update
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50, n) for n in (20, 9, 30)]
    score_documents(lambda ids: torch.zeros(*ids.shape, 50), docs, 8, 0, batch_size=2, desc="wiki")
    err = capsys.readouterr().err
    assert "\r" not in err
    got = [line for line in err.splitlines() if line.startswith("wiki:")]
    assert len(got) >= 3 and got[-1].startswith("wiki: 100%|") and "docs=3/3" in got[-1], err
