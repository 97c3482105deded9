"""The text of the small replication recipe (scripts/replicate.sh), packed to travel to a machine without network:
English Wikipedia (2015) training articles without the WikiText-103 validation and test articles, the held-out
Wikipedia articles, and the official WikiText-103 test file.

    python -m data_prep.wikipedia --wikipedia ../shared/data/wikipedia --wikitext ../shared/data/wikitext103 \\
        --out runs/replicate-pack/text [--max-mib 30] [--max-articles N]

Writes into ``--out``:

    wiki_train.jsonl.zst     training articles ({"id", "title", "text"}) in dump order, from the source's training
                             parts, until the compressed file reaches --max-mib (or --max-articles); articles whose
                             title is a WikiText-103 validation or test article (a `` = Title = `` heading of
                             wiki.valid.tokens / wiki.test.tokens, detokenized as lm-evaluation-harness detokenizes
                             WikiText) are left out, so the WikiText-103 score is not contaminated
    wiki_heldout.jsonl.gz    the source's held-out validation split ({"id", "title", "text"}), for evaluation
    wiki.test.tokens.gz      WikiText-103 test, the official tokenized file, byte for byte (toy runs: its first
                             --test-articles articles)
    manifest.json            sources (sha256), articles read, kept and removed (each removed title and the WikiText
                             split it is in), bytes, the settings; tokens are counted when the pack is tokenized
    SOURCES.md               origin and licence (CC BY-SA 3.0) of the text

``python -m data_prep.tokenize PACK/wiki_train.jsonl.zst`` reads the training file as it is. The pack is written
into a folder beside ``--out`` that replaces it once complete (other files there are kept), so an interrupted run
leaves the earlier pack whole.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
import sys
from pathlib import Path

from neox_dar.data.identity import sha256_file
from neox_dar.rundir import staged_dir

TRAIN_GLOB = "enwiki2015.train.part*.jsonl.zst"
HELDOUT = "enwiki2015.valid.jsonl.zst"
WIKITEXT_SPLITS = {"validation": "wiki.valid.tokens", "test": "wiki.test.tokens"}
HEADING = re.compile(r"^ = ([^=].*?) = $")  # a level-1 WikiText heading: an article title


class PackError(RuntimeError):
    """A problem that stops the packing; printed as one line."""


def normalize(title: str) -> str:
    """A title as compared: case-folded, single spaces."""
    return " ".join(title.split()).casefold()


def wikitext_titles(path: Path) -> list[str]:
    """The article titles of a WikiText ``.tokens`` file (its level-1 headings), detokenized (``@-@`` -> ``-``,
    `` ( `` -> `` (`` ...) with lm-evaluation-harness's WikiText detokenizer; ``<unk>`` stays."""
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    titles = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        m = HEADING.match(line)
        if m:
            titles.append(wikitext_detokenizer({"page": m.group(1)}).strip())
    if not titles:
        raise PackError(f"{path}: no ' = Title = ' article headings: not a WikiText file")
    return titles


class TitleMatcher:
    """Matches article titles against WikiText's: exactly after :func:`normalize`; a WikiText title holding
    ``<unk>`` (a word outside WikiText's vocabulary) matches any one word in its place, when it has a known word
    too. A title of ``<unk>`` words only cannot be matched (:attr:`unmatchable`)."""

    UNK = "<unk>"

    def __init__(self, titles: dict[str, str]):
        self.exact = {normalize(t): split for t, split in titles.items() if self.UNK not in t}
        self.patterns = []
        self.unmatchable = []
        for t, split in titles.items():
            words = normalize(t).split()
            if self.UNK not in words:
                continue
            if all(w == self.UNK for w in words):
                self.unmatchable.append(t)
                continue
            regex = " ".join(r"\S+" if w == self.UNK else re.escape(w) for w in words)
            self.patterns.append((re.compile(regex + r"\Z"), split))

    def split_of(self, title: str) -> tuple[str, str] | None:
        """(the WikiText split holding ``title``, "exact" or "pattern"), or None."""
        t = normalize(title)
        if t in self.exact:
            return self.exact[t], "exact"
        return next(((split, "pattern") for p, split in self.patterns if p.match(t)), None)


def _records(path: Path):
    """The JSON objects of a ``.jsonl.zst`` file, one per line."""
    import zstandard

    with open(path, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as r:
        for lineno, line in enumerate(io.TextIOWrapper(r, encoding="utf-8"), 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise PackError(f"{path}:{lineno}: not JSON ({e})") from None
            yield row


def first_articles(path: Path, n: int | None) -> bytes:
    """The bytes of a WikiText file up to its ``n + 1``-th article heading (all of it when ``n`` is None)."""
    data = path.read_bytes()
    if n is None:
        return data
    starts = [m.start() for m in re.finditer(rb"^ = [^=].*? = $", data, re.M)]
    return data[:starts[n]] if n < len(starts) else data


def pack(wikipedia: Path, wikitext: Path, out: Path, max_mib: float, max_articles: int | None = None,
         heldout_articles: int | None = None, test_articles: int | None = None, level: int = 19) -> dict:
    """Write the pack (module docstring); returns its manifest."""
    parts = sorted(wikipedia.glob(TRAIN_GLOB))
    heldout = wikipedia / HELDOUT
    if not parts or not heldout.is_file():
        raise PackError(f"{wikipedia} holds no {TRAIN_GLOB} and {HELDOUT}: point --wikipedia at the folder of the "
                        "English Wikipedia (2015) parts (docs/experiments.md, the small replication)")
    wt_files = {split: wikitext / name for split, name in WIKITEXT_SPLITS.items()}
    for f in wt_files.values():
        if not f.is_file():
            raise PackError(f"WikiText-103 file not found: {f}")
    titles = {t: split for split, f in wt_files.items() for t in wikitext_titles(f)}
    matcher = TitleMatcher(titles)
    with staged_dir(out, keep=True) as stage:  # the pack's files replace an earlier pack's together
        return _write_pack(stage, parts, heldout, wt_files, titles, matcher, max_mib, max_articles, heldout_articles,
                           test_articles, level)


def _write_pack(out: Path, parts: list[Path], heldout: Path, wt_files: dict[str, Path], titles: dict,
                matcher: TitleMatcher, max_mib: float, max_articles: int | None, heldout_articles: int | None,
                test_articles: int | None, level: int) -> dict:
    """:func:`pack`'s files, written into ``out`` (the staged folder); returns the manifest."""
    import zstandard

    limit = int(max_mib * 2**20)

    train = out / "wiki_train.jsonl.zst"
    read = kept = kept_bytes = 0
    removed, full = [], False
    with open(train, "wb") as f:
        writer = zstandard.ZstdCompressor(level=level).stream_writer(f, closefd=False)
        for part in parts:
            for row in _records(part):
                match = matcher.split_of(row["title"])
                read += 1
                if match is not None:
                    removed.append({"title": row["title"], "id": row["id"], "wikitext_split": match[0],
                                    "match": match[1]})
                    continue
                line = json.dumps({"id": row["id"], "title": row["title"], "text": row["text"]}) + "\n"
                writer.write(line.encode("utf-8"))
                kept += 1
                kept_bytes += len(row["text"].encode("utf-8"))
                if f.tell() >= limit or (max_articles is not None and kept >= max_articles):
                    full = True
                    break
            if full:
                break
        writer.close()

    held = out / "wiki_heldout.jsonl.gz"
    held_rows = list(_records(heldout))[:heldout_articles]
    with gzip.open(held, "wt", encoding="utf-8") as g:
        for row in held_rows:
            g.write(json.dumps({"id": row["id"], "title": row["title"], "text": row["text"]}) + "\n")
    test = out / "wiki.test.tokens.gz"
    with gzip.open(test, "wb") as dst:
        dst.write(first_articles(wt_files["test"], test_articles))

    sources = {str(p): sha256_file(p) for p in [*parts, heldout, *wt_files.values()]}
    manifest = {
        "sources": sources,
        "settings": {"max_mib": max_mib, "max_articles": max_articles, "heldout_articles": heldout_articles,
                     "test_articles": test_articles, "zstd_level": level},
        "train": {"file": train.name, "bytes": train.stat().st_size, "articles_read": read, "articles": kept,
                  "text_bytes": kept_bytes, "stopped_at_limit": full,
                  "removed_wikitext_articles": len(removed), "removed": removed},
        "heldout": {"file": held.name, "bytes": held.stat().st_size, "articles": len(held_rows),
                    "also_wikitext_articles": [r["title"] for r in held_rows if matcher.split_of(r["title"])]},
        "wikitext103_test": {"file": test.name, "bytes": test.stat().st_size,
                             "source_sha256": sources[str(wt_files["test"])],
                             "articles": "all" if test_articles is None else test_articles},
        "wikitext_titles": {split: sum(1 for s in titles.values() if s == split) for split in WIKITEXT_SPLITS},
        "wikitext_titles_unmatchable": matcher.unmatchable,
        "command": " ".join([Path(sys.executable).name, "-m", "data_prep.wikipedia", *sys.argv[1:]]),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "SOURCES.md").write_text(SOURCES)
    return manifest


SOURCES = """# Text of the replication recipe: origin and licence

- `wiki_train.jsonl.zst`, `wiki_heldout.jsonl.gz`: English Wikipedia (dump of about May 2015) as extracted by
  WikiExtractor, from jason-feng/wikiVisual (commit 1c0fac92f29f17c1603bfffbe864e0dfdff66897), as described in the
  neox-dar workspace's shared/data/SOURCES.md ("Wikipedia (2015)"); training articles whose title is a WikiText-103
  validation or test article removed (manifest.json lists them). Licence: CC BY-SA 3.0 (Wikipedia text).
- `wiki.test.tokens.gz`: WikiText-103 test, the official tokenized file (Merity et al., 2016; from
  Hongcheng-Gao/RobTest-Demo data/wikitext-103/wiki.test.tokens, md5 f202e4c8148839782adc13e7d1ca58e0), gzipped.
  Licence: CC BY-SA 3.0.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m data_prep.wikipedia", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wikipedia", required=True, type=Path, help="directory of the enwiki2015 JSONL parts")
    ap.add_argument("--wikitext", required=True, type=Path, help="directory of wiki.valid.tokens and wiki.test.tokens")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--max-mib", type=float, default=30.0, help="size of the compressed training file (MiB)")
    ap.add_argument("--max-articles", type=int, default=None, help="stop after this many training articles")
    ap.add_argument("--heldout-articles", type=int, default=None,
                    help="keep only the first N held-out articles (toy runs; default all 297)")
    ap.add_argument("--test-articles", type=int, default=None,
                    help="keep only the first N WikiText-103 test articles (toy runs; default the whole file)")
    args = ap.parse_args(argv)
    try:
        m = pack(args.wikipedia, args.wikitext, args.out, args.max_mib, args.max_articles, args.heldout_articles,
                 args.test_articles)
    except (PackError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = m["train"]
    print(f"wrote {args.out}: {t['articles']:,} training articles ({t['bytes'] / 2**20:.1f} MiB compressed, "
          f"{t['text_bytes'] / 2**20:.1f} MiB of text), {t['removed_wikitext_articles']} WikiText-103 articles removed "
          f"of {t['articles_read']:,} read; {m['heldout']['articles']} held-out articles; WikiText-103 test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
