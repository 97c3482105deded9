"""Generation with a checkpoint of any attention variant and model family, through each variant's inference cache
(the command line: :mod:`.__main__`, ``python -m neox_dar.generate``).

How it runs (docs/inference.md): the prompts of a batch are prefilled with the training forward (``attention_impl``'s
path; prompts of equal length together, no padding), then every row is decoded one token per step through its
layers' caches (:meth:`neox_dar.model.CausalLM.decode`), each row at its own positions. Sampling uses one random
generator per prompt, seeded with ``--seed`` plus the prompt's index, so a completion does not depend on the batch
it ran in. Ids of the vocabulary's padding rows are never produced.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Sequence

import torch
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from ..chat_render import render_chat
from ..evaluation.loading import load_for_eval
from ..evaluation.scoring import AttentionStatsMean
from ..model import CausalLM
from ..rundir import held_checkpoint, is_hf_folder
from ..tokenizer import hf_tokenizer, stop_token_ids, tokenizer_file


class GenerationError(ValueError):
    """A user mistake (a prompt, a setting, a checkpoint without a tokenizer): one line, exit 2 on the command line."""


MIN_TEMPERATURE = 1e-6  # below it the logits / temperature overflow (NaN probabilities); it is greedy in effect
DEFAULT_TOP_K = 50  # transformers' generate samples from the 50 most likely tokens unless told otherwise


@dataclass
class Sampling:
    """``temperature`` 0: greedy (the highest logit); otherwise (finite, at least :data:`MIN_TEMPERATURE`) softmax
    sampling at that temperature, restricted to the ``top_k`` most likely tokens (unset: :data:`DEFAULT_TOP_K`, as
    transformers' ``generate``; 0: every token) and the smallest set holding ``top_p`` of the probability
    (transformers' warpers, in its order)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if self.temperature != 0 and not MIN_TEMPERATURE <= self.temperature < math.inf:
            raise GenerationError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, got "
                                  f"{self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise GenerationError(f"top_k must be >= 0 (0: no top-k), got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.greedy and (self.top_k is not None or self.top_p is not None):
            raise GenerationError("top_k/top_p have no effect with temperature 0 (greedy); set a temperature > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def warpers(self) -> LogitsProcessorList:
        out = LogitsProcessorList([TemperatureLogitsWarper(self.temperature)])
        top_k = DEFAULT_TOP_K if self.top_k is None else self.top_k
        if top_k > 0:
            out.append(TopKLogitsWarper(top_k))
        if self.top_p is not None and self.top_p < 1.0:
            out.append(TopPLogitsWarper(self.top_p))
        return out


@dataclass
class Completion:
    token_ids: list[int] = field(default_factory=list)  # the generated ids (an ending eos included)
    finish_reason: str = "length"                       # "eos", "stop" (a stop rule) or "length"


def check_prompts(prompts: Sequence[Sequence[int]], max_positions: int) -> None:
    """GenerationError for an empty prompt or one that leaves no position for a new token."""
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise GenerationError(f"prompt {i} is empty (it encodes to no tokens)")
        if len(p) >= max_positions:
            raise GenerationError(f"prompt {i} has {len(p)} tokens; max_position_embeddings={max_positions} leaves "
                                  "no position for a new token")


@torch.inference_mode()
def generate(model: CausalLM, prompts: Sequence[Sequence[int] | torch.Tensor], max_new_tokens: int,
             eos_ids: Collection[int] = (), sampling: Sampling | None = None, seeds: Sequence[int] | None = None,
             on_token: Callable[[int, int], None] | None = None,
             stop: Callable[[int, list[int]], bool] | None = None,
             stats: AttentionStatsMean | None = None,
             prompt_stats: AttentionStatsMean | None = None) -> list[Completion]:
    """Continue each prompt (token ids) by up to ``max_new_tokens`` tokens, stopping a row at any of ``eos_ids``, when
    ``stop(row, generated ids)`` is true, or at ``max_position_embeddings``.

    The prompts are prefilled with the training forward, then all rows decode together through the caches, one
    token per step. ``seeds`` (one per prompt) seed a random generator per row for sampling (None: torch's global
    generator). ``on_token(row, id)`` is called for each new token as it is chosen. ``stats`` accumulates the
    variants' per-token statistics (AHA's gates) of the generated tokens as they are processed (every generated
    token but a row's last, which no step reads), ``prompt_stats`` those of the prompts' tokens. Ids ``>= cfg.vocab_size`` (the padding rows of the vocabulary) are never chosen."""
    cfg = model.cfg
    sampling = sampling or Sampling()
    if max_new_tokens < 1:
        raise GenerationError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = model.head.weight.device
    prompts = [torch.as_tensor(p, dtype=torch.long, device=device).reshape(-1) for p in prompts]
    check_prompts(prompts, cfg.max_position_embeddings)
    B = len(prompts)
    limits = [min(max_new_tokens, cfg.max_position_embeddings - p.numel()) for p in prompts]
    cache = model.new_cache([p.numel() for p in prompts], max(limits))
    generators = None
    if not sampling.greedy and seeds is not None:
        generators = [torch.Generator(device).manual_seed(int(s)) for s in seeds]
    warpers = None if sampling.greedy else sampling.warpers()
    on_group = None if prompt_stats is None else (lambda rows: prompt_stats.add())
    logits = model.prefill(prompts, cache, on_group=on_group).float()
    out = [Completion() for _ in range(B)]
    active = [True] * B
    for _ in range(max(limits)):
        logits[:, cfg.vocab_size:] = float("-inf")
        if sampling.greedy:
            chosen = logits.argmax(-1)
        else:
            probs = torch.softmax(warpers(None, logits), -1)
            chosen = (torch.multinomial(probs, 1)[:, 0] if generators is None else
                      torch.cat([torch.multinomial(probs[b], 1, generator=generators[b]) for b in range(B)]))
        chosen_ids = chosen.tolist()
        for b in range(B):
            if not active[b]:
                continue
            token = chosen_ids[b]
            out[b].token_ids.append(token)
            if on_token is not None:
                on_token(b, token)
            if token in eos_ids:
                out[b].finish_reason, active[b] = "eos", False
            elif stop is not None and stop(b, out[b].token_ids):
                out[b].finish_reason, active[b] = "stop", False
            elif len(out[b].token_ids) >= limits[b]:
                active[b] = False
        if not any(active):
            break
        logits = model.decode(chosen[:, None], cache)[:, -1].float()
        if stats is not None:
            stats.add(torch.tensor(active)[:, None])
    return out


# ----------------------------------------------------------------------------------------------
# loading a checkpoint with its tokenizer


@dataclass
class Generator:
    """A model in eval mode with its tokenizer (a transformers fast tokenizer) and the ids that end a generation
    (:func:`~neox_dar.tokenizer.stop_token_ids`)."""

    model: CausalLM
    tokenizer: object
    eos_ids: tuple[int, ...]
    info: dict

    def encode(self, text: str) -> list[int]:
        """The prompt's ids with the tokenizer's own post-processor (Llama-3 prepends its bos; Pythia, OLMo-2 and
        Qwen add nothing), as data preparation encodes documents."""
        return self.tokenizer(text)["input_ids"]

    def chat(self, text: str) -> tuple[str, list[int]]:
        """``text`` as one user turn rendered by the checkpoint's chat template with the generation prompt, and its
        ids (the template places any special tokens itself, as ``data_prep.chat`` renders conversations); a template
        that fails, or renders longer than :data:`~neox_dar.chat_render.RENDER_SECONDS`, is a one-line
        :class:`~neox_dar.chat_render.ChatTemplateError`."""
        if not self.tokenizer.chat_template:
            raise GenerationError(f"--chat: the tokenizer {self.info['tokenizer']} has no chat template (none in "
                                  "its tokenizer_config.json or chat_template.jinja)")
        rendered = render_chat(self.tokenizer, [{"role": "user", "content": text}], tokenize=False,
                               add_generation_prompt=True)
        return rendered, self.tokenizer(rendered, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def load(path: str | Path, device: str | None = None, dtype: str = "float32", attention_impl: str | None = None,
         tokenizer: str | Path | None = None) -> Generator:
    """The model at ``path`` (as :func:`neox_dar.evaluation.loading.load_for_eval` loads it: a verified checkpoint or
    a Hugging Face folder) with its tokenizer (:func:`neox_dar.tokenizer.tokenizer_file`: the one the checkpoint
    records, else its config's ``vocab_file``; ``tokenizer`` only when it is that same file, or the checkpoint
    records none). It stops at the ``tokenizer_config.json``'s eos beside it, else Pythia's ``<|endoftext|>``, and at
    the ids of the ``generation_config.json`` there (:func:`~neox_dar.tokenizer.stop_token_ids`)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with ExitStack() as held:  # a run's checkpoint is held while its weights and tokenizer are read
        where = path if is_hf_folder(path) else held.enter_context(held_checkpoint(path))
        loaded = load_for_eval(where, device, dtype, attention_impl)
        file = tokenizer_file(loaded.cfg, tokenizer, loaded.model_dir)
        tok = hf_tokenizer(file)
    return Generator(loaded.model, tok, stop_token_ids(file), {**loaded.info, "tokenizer": str(file)})
