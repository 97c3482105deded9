"""Rolling-window perplexity of the evaluation corpora inside the training job (``eval_perplexity.interval``).

The DAR paper's Fig. 3 plots Rel. (%) over training; this gives the report a real evaluation at every
``interval`` steps (and after the last step) instead of a validation-loss proxy. Rank 0 loads the documents (the
sweep's pinned manifest when the run belongs to a sweep, else ``{save}/eval_manifest.json``, so every evaluation of
the run scores the same documents) and shares their token ids; every rank then scores its share of the windows and
the ranks' scores are added in the one-process order (:func:`neox_dar.evaluation.scoring.score_documents`). Results
are written as ``{save}/eval/step_XXXXXXXX.json``, in the format of ``python -m eval.perplexity`` (which the report
reads), and returned as one metrics row (``ppl/<corpus>``, statistics such as ``mu_f``) for the logs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import Config
from ..evaluation.corpora import manifest_hash
from ..evaluation.metrics import corpus_metrics, count_bytes, count_chars, count_words
from ..evaluation.parallel import EvalGroup
from ..evaluation.perplexity import SWEEP_MANIFEST, pinned_corpora
from ..evaluation.scoring import overall_means, score_documents
from ..rundir import EVAL_DIR, RUN_META, write_text_atomic
from ..tokenizer import RUN_TOKENIZER_DIR, encode_texts, prefix_token_id, read_tokenizer, tokenizer_file
from .distributed import DistInfo


class CorpusEvaluator:
    """Scores the configured corpora on the training model; construct on every rank (collective)."""

    def __init__(self, cfg: Config, info: DistInfo):
        self.cfg, self.info = cfg, info
        e = cfg.run.eval_perplexity
        save = Path(cfg.run.save)
        manifest = (save.resolve().parent if (save / RUN_META).is_file() else save) / SWEEP_MANIFEST
        shared: list = [None]
        if info.is_main:
            from ..evaluation.corpora import HUB_DEFAULT_DOCS

            default = HUB_DEFAULT_DOCS if e.source == "hub" else {}
            max_docs = {c: e.max_docs if e.max_docs is not None else default.get(c) for c in e.corpora}
            docs, entries = pinned_corpora(manifest, list(e.corpora), e.source, None, {}, max_docs)
            path = tokenizer_file(cfg.model, model_dir=save / RUN_TOKENIZER_DIR)  # the run's recorded tokenizer
            tokenizer = read_tokenizer(path)
            shared[0] = {
                "prefix": prefix_token_id(path),
                "corpora": {name: {"ids": encode_texts(tokenizer, [d.text for d in docs[name]]),
                                   "words": sum(count_words(d.count_text) for d in docs[name]),
                                   "bytes": sum(count_bytes(d.count_text) for d in docs[name]),
                                   "chars": sum(count_chars(d.count_text) for d in docs[name]),
                                   "documents": len(docs[name]), "manifest_sha256": entries[name]["sha256"],
                                   "source": entries[name]["source"]} for name in e.corpora},
                "manifest_hash": manifest_hash(entries),
            }
        if info.world_size > 1:
            dist.broadcast_object_list(shared, src=0)
        self.data = shared[0]

    @torch.no_grad()
    def __call__(self, engine, step: int) -> dict:
        """Score every corpus at ``step`` (collective); rank 0 writes ``{save}/eval/step_N.json``. Returns the
        metrics row."""
        cfg, info = self.cfg, self.info
        engine.eval()
        corpora = {}
        try:
            for name, c in self.data["corpora"].items():
                scores = score_documents(engine.module, c["ids"], cfg.model.seq_length, self.data["prefix"],
                                         batch_size=cfg.run.eval_perplexity.batch_size, device=info.device,
                                         progress=False, rank=info.rank, world_size=info.world_size,
                                         all_gather=EvalGroup(info.rank, info.world_size).all_gather)
                result = corpus_metrics(float(sum(scores.nll)), int(sum(scores.tokens)), c["words"], c["bytes"],
                                        c["documents"], c["chars"])
                result.update(manifest_sha256=c["manifest_sha256"], source=c["source"], seconds=scores.seconds)
                if scores.attention_stats:
                    result["attention_stats"] = scores.attention_stats
                    result.update(overall_means(scores.attention_stats))
                corpora[name] = result
        finally:
            engine.train()
        if info.is_main:
            out = Path(cfg.run.save) / EVAL_DIR / f"step_{step:08d}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            body = {"step": step, "in_training": True, "max_length": cfg.model.seq_length,
                    "stride": cfg.model.seq_length, "manifest_hash": self.data["manifest_hash"], "corpora": corpora}
            write_text_atomic(out, json.dumps(body, indent=1) + "\n")
        row = {"step": step, **{f"ppl/{name}": r["token_perplexity"] for name, r in corpora.items()}}
        for name, r in corpora.items():
            row.update({f"{stat}/{name}": r[stat] for stat in overall_means(r.get("attention_stats") or {})})
        return row
