"""lm-evaluation-harness model ``neox_dar``: any neox-dar checkpoint (every attention variant) or Hugging Face
GPT-NeoX folder, with the Pythia tokenizer, for downstream tasks.

    python -m eval.lm_eval_cli --model neox_dar --model_args checkpoint=runs/dar-70m,dtype=bfloat16 \\
        --tasks hellaswag,mmlu --batch_size 16 --device cuda:0

``NeoxDarLM`` subclasses lm-eval's ``HFLM``, so request batching, rolling windows, truncation and
answer post-processing are lm-eval's own; only the forward pass (our ``CausalLM``) and generation are ours:
``generate_until`` decodes a batch of requests through the attention variants' inference caches
(:func:`neox_dar.generate.generate`: prompts prefilled with the training forward, without padding, then one token
per step for every row). Attention statistics of the model (e.g. AHA's full-attention usage ``mu_f`` per layer and head) are averaged
over the real (non-padding) positions of every log-likelihood request's forward and, in generation requests, over the
positions that choose a generated token (the prompt's last position, then every generated token fed back: one per
generated token, AHA's Eq. 8 "averaged across all L layers, m heads, and n generated tokens"; the prompt's other
positions are not counted), and reported in the results' ``config`` section beside the scores (``attention_stats``
and ``mu_f``), and logged at the end. ``--device cuda`` (lm-eval's
default) on a machine without CUDA falls back to the CPU with a warning, as lm-eval's ``hf`` model does.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import warnings
from types import SimpleNamespace

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils_hf import stop_sequences_criteria
from transformers import AutoConfig, PretrainedConfig

from neox_dar.hf import hf_config_dict
from neox_dar.model import CausalLM
from neox_dar.notices import Notice

from neox_dar.evaluation.loading import load_for_eval
from neox_dar.evaluation.scoring import AttentionStatsMean, overall_means
from neox_dar.generate import Sampling, generate
from neox_dar.tokenizer import hf_tokenizer, special_token_ids, tokenizer_file


class _LastPromptPosition:
    """``prompt_stats`` of :func:`neox_dar.generate.generate` that counts, of each prefill forward (prompts of one
    length, no padding), only the rows' last position: the one whose statistics (AHA's gates) choose the first
    generated token. With the fed-back tokens that ``stats`` counts, generation counts one position per generated
    token (AHA's Eq. 8)."""

    def __init__(self, stats: AttentionStatsMean):
        self.stats = stats

    def add(self) -> None:
        current = self.stats.current()
        if current:
            B, T = next(iter(current.values())).shape[:2]
            last = torch.zeros(B, T, dtype=torch.bool)
            last[:, -1] = True
            self.stats.add(last, current)


class _HFModelView(torch.nn.Module):
    """The few ``PreTrainedModel`` attributes ``HFLM`` reads from a model passed in as an object."""

    def __init__(self, model: CausalLM, config: PretrainedConfig):
        super().__init__()
        self.lm = model
        self.config = config

    @property
    def device(self) -> torch.device:
        return self.lm.head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.head.weight.dtype

    def tie_weights(self) -> None:
        """The model ties its own embeddings (when its config says so) when it is built or loaded."""

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.lm(input_ids))


def resolve_device(device: str | None) -> str:
    """``device``, or the CPU (with a warning) when it names CUDA and CUDA is unavailable; None picks CUDA when
    available, else the CPU."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        warnings.warn(f"neox_dar: device '{device}' requested but CUDA is not available; running on the CPU",
                      Notice, stacklevel=2)
        return "cpu"
    return device


def _whole(name: str, value, least: int) -> int:
    """A model_args value that must be a whole number >= ``least``: an int, or its digits (lm-eval hands over the
    text of a value it does not read as a number)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"model_args of neox_dar: {name} must be a whole number >= {least}, got {value!r}")
    return value


@register_model("neox_dar")
class NeoxDarLM(HFLM):
    """lm-eval model over a neox-dar checkpoint; ``--model_args checkpoint=PATH[,dtype=..,attention_impl=..,
    tokenizer=PATH,max_length=N,dimpo=FILE,dimpo_layers=l]``. ``max_length`` defaults to the checkpoint's
    ``seq_length``; ``dimpo``/``dimpo_layers``: the last ``l`` layers attend with the projections of a DimPO
    projection file (:func:`neox_dar.dimpo.apply.apply_projections`; recorded in the results' config)."""

    def __init__(self, checkpoint: str | None = None, device: str | None = None, dtype: str = "float32",
                 attention_impl: str | None = None, tokenizer: str | None = None, max_length: int | None = None,
                 dimpo: str | None = None, dimpo_layers: int | str = 0, **kwargs):
        kwargs.pop("pretrained", None)
        unknown = sorted(set(kwargs) - set(inspect.signature(HFLM.__init__).parameters))
        if unknown:  # HFLM would ignore them (it is handed a model): a misspelt dtype= must not run in float32
            raise ValueError(f"model_args of neox_dar: unknown {', '.join(unknown)} (its own: checkpoint, device, "
                             "dtype, attention_impl, tokenizer, max_length, dimpo, dimpo_layers; and lm-eval's hf "
                             "model's, e.g. batch_size, add_bos_token)")
        if checkpoint is None:
            raise ValueError("model_args of neox_dar: checkpoint=PATH is needed (a run, a step directory or a model "
                             "folder)")
        max_length = None if max_length is None else _whole("max_length", max_length, 1)
        dimpo_layers = _whole("dimpo_layers", dimpo_layers, 0)
        device = resolve_device(device)
        loaded = load_for_eval(checkpoint, device, dtype, attention_impl)
        if dimpo is not None:
            from neox_dar.dimpo.apply import apply_projections

            model, cfg, info = apply_projections(loaded.model, loaded.cfg, dimpo, dimpo_layers)
            loaded = dataclasses.replace(loaded, model=model, cfg=cfg, info={**loaded.info, "dimpo": info})
        elif dimpo_layers:
            raise ValueError("dimpo_layers needs dimpo=FILE (a projection file)")
        path = tokenizer_file(loaded.cfg, tokenizer, loaded.model_dir)
        tok = hf_tokenizer(path)
        config = hf_config_dict(loaded.cfg, special_token_ids(path))
        view = _HFModelView(loaded.model, AutoConfig.for_model(config.pop("model_type"), **config))
        if max_length is not None and max_length > loaded.cfg.max_position_embeddings:
            raise ValueError(f"max_length {max_length} exceeds the checkpoint's max_position_embeddings "
                             f"{loaded.cfg.max_position_embeddings}")
        super().__init__(pretrained=view, backend="causal", tokenizer=tok,
                         max_length=max_length or loaded.cfg.seq_length, device=device, **kwargs)
        self._lm = loaded.model
        self._info = loaded.info
        self._stats = AttentionStatsMean(loaded.model)
        self._pending: dict[str, torch.Tensor] = {}  # the last _model_call's per-token statistics, (B, T, ...)
        self._pending_row = 0

    def _forward(self, inps: torch.Tensor) -> torch.Tensor:
        """``inps`` (B, T) -> logits (B, T, V)."""
        with torch.inference_mode(), torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                                    enabled=self.mixed_precision_dtype is not None):
            return self._lm(inps)

    def _model_call(self, inps: torch.Tensor, attn_mask: torch.Tensor | None = None,
                    labels: torch.Tensor | None = None) -> torch.Tensor:
        """``inps`` (B, T), right-padded by lm-eval -> logits (B, T, V). The rows' real lengths are known only
        when lm-eval hands each row to :meth:`_select_cont_toks`, so the forward's attention statistics wait
        there (a forward whose rows never arrive, such as lm-eval's batch-size probe, is not counted)."""
        if attn_mask is not None or labels is not None:
            raise ValueError("neox_dar is a decoder-only model; encoder-decoder calls are not supported")
        logits = self._forward(inps)
        self._pending, self._pending_row = self._stats.current(), 0
        return logits

    def _select_cont_toks(self, logits: torch.Tensor, contlen: int | None = None,
                          inplen: int | None = None) -> torch.Tensor:
        """lm-eval calls this once per row of the last :meth:`_model_call`, in order, with the row's real length
        ``inplen``: count that row's first ``inplen`` positions in the attention statistics."""
        if self._pending:
            row = self._pending_row
            self._stats.add(torch.arange(logits.shape[0])[None] < inplen,
                            {k: v[row:row + 1] for k, v in self._pending.items()})
            self._pending_row += 1
        return super()._select_cont_toks(logits, contlen=contlen, inplen=inplen)

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str],
                        **generation_kwargs) -> torch.Tensor:
        """Continue each row of ``context`` (B, T, left-padded; ``attention_mask`` marks real tokens) by up to
        ``max_length - T`` tokens through the inference caches, stopping a row at the eos token or at any ``stop``
        string (lm-eval's own criteria); greedy unless ``do_sample`` with a positive ``temperature`` (``top_k``,
        ``top_p`` honoured, ``top_k`` 50 when unset, as HF's ``generate``; torch's global generator, as HFLM). The
        attention statistics count each prompt's last position and each generated token as it is fed back: one
        position per generated token (AHA's Eq. 8).
        Returns (B, T + new) right-padded with eos."""
        mask = generation_kwargs.pop("attention_mask", None)
        temperature = float(generation_kwargs.get("temperature", 0.0) or 0.0)
        sampling = Sampling()
        if bool(generation_kwargs.get("do_sample", False)) and temperature > 0.0:
            top_k, top_p = generation_kwargs.get("top_k"), generation_kwargs.get("top_p")
            sampling = Sampling(temperature, int(top_k) if top_k is not None else None,
                                float(top_p) if top_p is not None and float(top_p) < 1.0 else None)
        prompts = [context[b] if mask is None else context[b][mask[b].bool()] for b in range(context.shape[0])]
        criteria = [stop_sequences_criteria(self.tokenizer, stop, p.numel(), 1) for p in prompts]

        def stopped(row: int, ids: list[int]) -> bool:
            tokens = torch.cat([prompts[row], torch.tensor(ids, device=prompts[row].device)])[None]
            return bool(criteria[row](tokens, None).all())

        done = generate(self._lm, prompts, max_length - context.shape[1], eos_ids=(self.eot_token_id,),
                        sampling=sampling, stop=stopped if stop else None, stats=self._stats,
                        prompt_stats=_LastPromptPosition(self._stats))
        rows = [torch.cat([context[b], torch.tensor(c.token_ids, dtype=context.dtype, device=context.device)])
                for b, c in enumerate(done)]
        width = max(r.numel() for r in rows)
        out = torch.full((len(rows), width), self.eot_token_id, dtype=context.dtype, device=context.device)
        for b, r in enumerate(rows):
            out[b, :r.numel()] = r
        return out

    def reset_attention_stats(self) -> None:
        """Start counting the attention statistics afresh (e.g. per task)."""
        self._stats = AttentionStatsMean(self._lm)

    def window_size(self) -> int:
        """The checkpoint's ``window_size`` (the downstream suites' short-context filter)."""
        return int(self._lm.cfg.attention.window_size)

    def describe(self) -> dict:
        """What was evaluated: the checkpoint's model config (flat) and step."""
        from neox_dar.config import model_flat

        return {"config": model_flat(self._lm.cfg), **self._info}

    def attention_stats(self) -> dict:
        """Means over this run's real positions of the model's attention statistics, and each statistic's overall
        mean over layers and heads (e.g. AHA's ``mu_f``)."""
        stats = self._stats.result()
        return {"attention_stats": stats, **overall_means(stats)}

    def get_model_info(self) -> dict:
        info = {"model_num_parameters": sum(p.numel() for p in self._lm.parameters()),
                "model_dtype": str(self._lm.head.weight.dtype), "model_revision": self.revision,
                "model_sha": "", **{f"neox_dar_{k}": v for k, v in self._info.items()}}
        stats = self.attention_stats()
        for name, value in stats.items():
            if name != "attention_stats":
                print(f"neox_dar: {name} = {value:.4f} over this run (per layer and head: config.attention_stats in "
                      "the results)", file=sys.stderr)
        return {**info, **stats}
