"""lm-evaluation-harness model ``neox_dar``: any neox-dar checkpoint (every attention variant) or Hugging Face
GPT-NeoX folder, with the Pythia tokenizer, for downstream tasks.

    python -m eval.lm_eval_cli --model neox_dar --model_args checkpoint=runs/dar-70m,dtype=bfloat16 \\
        --tasks hellaswag,mmlu --batch_size 16 --device cuda:0

``NeoxDarLM`` subclasses lm-eval's ``HFLM``, so request batching, rolling windows, truncation and
answer post-processing are lm-eval's own; only the forward pass (our ``CausalLM``) and generation (an
incremental-free loop over our forward, one request at a time so left padding never enters a context) are
ours. Attention statistics of the model (AHA's full-attention usage ``mu_f`` per layer and head) are averaged
over every forward of the run and reported in the results' ``config`` section beside the scores
(``attention_stats`` and ``mu_f``), and logged at the end.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils_hf import stop_sequences_criteria
from transformers import GPTNeoXConfig, PreTrainedTokenizerFast
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from neox_dar.convert import hf_config_dict
from neox_dar.model import CausalLM

from .loading import DEFAULT_TOKENIZER, PREFIX_TOKEN, load_for_eval
from .scoring import AttentionStatsMean


class _HFModelView(torch.nn.Module):
    """The few ``PreTrainedModel`` attributes ``HFLM`` reads from a model passed in as an object."""

    def __init__(self, model: CausalLM, config: GPTNeoXConfig):
        super().__init__()
        self.lm = model
        self.config = config

    @property
    def device(self) -> torch.device:
        return self.lm.embed_out.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.embed_out.weight.dtype

    def tie_weights(self) -> None:
        """Pythia's input and output embeddings are untied, so there is nothing to tie."""

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.lm(input_ids))


def pythia_hf_tokenizer(path: str | None = None) -> PreTrainedTokenizerFast:
    """The Pythia tokenizer as a ``transformers`` fast tokenizer (bos = eos = unk = ``<|endoftext|>``)."""
    return PreTrainedTokenizerFast(tokenizer_file=str(path or DEFAULT_TOKENIZER), bos_token=PREFIX_TOKEN,
                                   eos_token=PREFIX_TOKEN, unk_token=PREFIX_TOKEN)


@register_model("neox_dar")
class NeoxDarLM(HFLM):
    """lm-eval model over a neox-dar checkpoint; ``--model_args checkpoint=PATH[,dtype=..,attention_impl=..,
    tokenizer=PATH,max_length=N]``. ``max_length`` defaults to the checkpoint's ``seq_length``."""

    def __init__(self, checkpoint: str, device: str | None = None, dtype: str = "float32",
                 attention_impl: str | None = None, tokenizer: str | None = None, max_length: int | None = None,
                 **kwargs):
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        loaded = load_for_eval(checkpoint, device, dtype, attention_impl)
        tok_path = tokenizer
        if tok_path is None and loaded.hf_dir is not None and (loaded.hf_dir / "tokenizer.json").is_file():
            tok_path = str(loaded.hf_dir / "tokenizer.json")
        view = _HFModelView(loaded.model, GPTNeoXConfig(**hf_config_dict(loaded.cfg)))
        kwargs.pop("pretrained", None)
        super().__init__(pretrained=view, backend="causal", tokenizer=pythia_hf_tokenizer(tok_path),
                         max_length=max_length or loaded.cfg.seq_length, device=device, **kwargs)
        self._lm = loaded.model
        self._info = loaded.info
        self._stats = AttentionStatsMean(loaded.model)

    def _model_call(self, inps: torch.Tensor, attn_mask: torch.Tensor | None = None,
                    labels: torch.Tensor | None = None) -> torch.Tensor:
        """``inps`` (B, T) -> logits (B, T, V); accumulates the model's attention statistics."""
        if attn_mask is not None or labels is not None:
            raise ValueError("neox_dar is a decoder-only model; encoder-decoder calls are not supported")
        with torch.inference_mode(), torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                                    enabled=self.mixed_precision_dtype is not None):
            logits = self._lm(inps)
        self._stats.add(inps.numel())
        return logits

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str],
                        **generation_kwargs) -> torch.Tensor:
        """Continue each row of ``context`` (B, T, left-padded; ``attention_mask`` marks real tokens) by up to
        ``max_length - T`` tokens, stopping a row at any ``stop`` string; greedy unless ``do_sample`` with a
        positive ``temperature`` (``top_k``, ``top_p`` honoured). Returns (B, T + new) right-padded with eos."""
        mask = generation_kwargs.pop("attention_mask", None)
        temperature = float(generation_kwargs.get("temperature", 0.0) or 0.0)
        sample = bool(generation_kwargs.get("do_sample", False)) and temperature > 0.0
        warpers = LogitsProcessorList()
        if sample:
            warpers.append(TemperatureLogitsWarper(temperature))
            if generation_kwargs.get("top_k"):
                warpers.append(TopKLogitsWarper(int(generation_kwargs["top_k"])))
            if generation_kwargs.get("top_p") is not None and float(generation_kwargs["top_p"]) < 1.0:
                warpers.append(TopPLogitsWarper(float(generation_kwargs["top_p"])))
        new_tokens = max_length - context.shape[1]
        rows = []
        for b in range(context.shape[0]):
            prompt = context[b] if mask is None else context[b][mask[b].bool()]
            tokens = prompt[None]
            criteria = stop_sequences_criteria(self.tokenizer, stop, prompt.numel(), 1)
            for _ in range(new_tokens):
                logits = self._model_call(tokens[:, -self.max_length:])[:, -1, :].float()
                if sample:
                    probs = torch.softmax(warpers(tokens, logits), dim=-1)
                    nxt = torch.multinomial(probs, 1)
                else:
                    nxt = logits.argmax(dim=-1, keepdim=True)
                tokens = torch.cat([tokens, nxt], dim=1)
                if bool(criteria(tokens, None).all()):
                    break
            rows.append(torch.cat([context[b], tokens[0, prompt.numel():]]))
        width = max(r.numel() for r in rows)
        out = torch.full((len(rows), width), self.eot_token_id, dtype=context.dtype, device=context.device)
        for b, r in enumerate(rows):
            out[b, :r.numel()] = r
        return out

    def attention_stats(self) -> dict:
        """Token-weighted means over this run's forwards of the model's attention statistics, plus ``mu_f``:
        the overall mean of the ``layer{l}/mu_f`` values when the model reports them (AHA)."""
        stats = self._stats.result()
        mu = [v for k, values in stats.items() if k.endswith("/mu_f") for v in values]
        return {"attention_stats": stats, "mu_f": sum(mu) / len(mu) if mu else None}

    def get_model_info(self) -> dict:
        info = {"model_num_parameters": sum(p.numel() for p in self._lm.parameters()),
                "model_dtype": str(self._lm.embed_out.weight.dtype), "model_revision": self.revision,
                "model_sha": "", **{f"neox_dar_{k}": v for k, v in self._info.items()}}
        stats = self.attention_stats()
        if stats["mu_f"] is not None:
            print(f"neox_dar: AHA full-attention usage mu_f = {stats['mu_f']:.4f} over this run (per layer and "
                  "head: config.attention_stats in the results)", file=sys.stderr)
        return {**info, **stats}
