"""The Pythia (GPT-NeoX) language model, readable top to bottom.

Parameter names are Hugging Face's ``GPTNeoXForCausalLM`` names (``gpt_neox.layers.{l}.attention.query_key_value``,
..., ``embed_out.weight``), so a vanilla model converts to and from Hugging Face by renaming nothing.

    model = build_model(cfg)
    logits = model(input_ids)          # (B, T) -> (B, T, padded_vocab_size)
    loss = lm_loss + model.aux_loss()  # variants' extra loss terms (AHA's L1), 0 for the others
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from .attention import Attention, RotaryEmbedding, build_attention
from .config import ModelConfig


class MLP(nn.Module):
    """``dense_4h_to_h(gelu(dense_h_to_4h(m)))`` with exact (erf) GeLU; (B, T, d) -> (B, T, d)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size)
        self.dense_4h_to_h = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size)

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(m)))


class Block(nn.Module):
    """One GPT-NeoX layer. Parallel residual: ``x + Attn(LN1(x)) + MLP(LN2(x))``;
    sequential otherwise: ``y = x + Attn(LN1(x)); y + MLP(LN2(y))``."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.parallel = cfg.gpt_j_residual
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.attention = build_attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn = self.dropout(self.attention(self.input_layernorm(x), cos, sin))
        if self.parallel:
            return x + attn + self.dropout(self.mlp(self.post_attention_layernorm(x)))
        y = x + attn
        return y + self.dropout(self.mlp(self.post_attention_layernorm(y)))


class GPTNeoX(nn.Module):
    """Embedding, layers and final norm; ``input_ids`` (B, T) -> hidden states (B, T, d)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_in = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.rotary_emb = RotaryEmbedding(cfg.rotary_ndims, cfg.rotary_emb_base)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embed_in(input_ids))
        cos, sin = self.rotary_emb(input_ids.shape[1], x.dtype, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.final_layer_norm(x)


class CausalLM(nn.Module):
    """``GPTNeoXForCausalLM``-shaped model: ``forward(input_ids[B,T]) -> logits[B,T,V]``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if not cfg.no_weight_tying:
            raise ValueError("no_weight_tying: false (tied embeddings) is not supported; Pythia unties them")
        self.cfg = cfg
        self.gpt_neox = GPTNeoX(cfg)
        self.embed_out = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_out(self.gpt_neox(input_ids))

    def attention_modules(self) -> list[Attention]:
        """Each layer's attention module, in layer order (also when the engine wraps the blocks)."""
        return [m for m in self.modules() if isinstance(m, Attention)]

    def aux_loss(self) -> torch.Tensor:
        """Sum of the variants' auxiliary loss terms from the last forward (already scaled by their coefficients)."""
        terms = [m.aux_loss for m in self.attention_modules() if m.aux_loss is not None]
        if not terms:
            return torch.zeros((), device=self.embed_out.weight.device)
        return torch.stack(terms).sum()

    def attention_stats(self) -> dict[str, torch.Tensor]:
        """Per-layer statistics from the last forward, keyed ``layer{l}/{name}`` (a variant's per-head stats)."""
        return {f"layer{m.layer_idx}/{k}": v for m in self.attention_modules() for k, v in m.stats.items()}


# ----------------------------------------------------------------------------------------------
# initialisation (GPT-NeoX / Pythia)


def init_std(method: str, cfg: ModelConfig) -> float:
    """``small_init``: sqrt(2 / (5 d)); ``wang_init``: 2 / (L sqrt(d)); ``normal``: init_method_std."""
    d = cfg.hidden_size
    if method == "small_init":
        return math.sqrt(2.0 / (5.0 * d))
    if method == "wang_init":
        return 2.0 / (cfg.num_layers * math.sqrt(d))
    return cfg.init_method_std


def init_weights(model: CausalLM, cfg: ModelConfig) -> None:
    """Pythia init: output projections of each residual branch (``attention.dense``, ``mlp.dense_4h_to_h``)
    use ``output_layer_init_method``; every other matrix and the embeddings use ``init_method``; biases 0;
    LayerNorms weight 1, bias 0."""
    std_in = init_std(cfg.init_method, cfg)
    std_out = init_std(cfg.output_layer_init_method, cfg)
    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            is_out = name.endswith("attention.dense") or name.endswith("mlp.dense_4h_to_h")
            nn.init.normal_(module.weight, mean=0.0, std=std_out if is_out else std_in)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


def build_model(cfg: ModelConfig) -> CausalLM:
    """Build and initialise the model for ``cfg`` (works under ``torch.device("meta")`` for counting)."""
    model = CausalLM(cfg)
    if next(model.parameters()).device.type != "meta":
        init_weights(model, cfg)
    return model


# ----------------------------------------------------------------------------------------------
# size and cost


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total parameters, and non-embedding parameters (total minus the input embedding)."""
    total = sum(p.numel() for p in model.parameters())
    embed = sum(p.numel() for n, p in model.named_parameters() if n.endswith("embed_in.weight"))
    return {"total": total, "non_embedding": total - embed}


def flops_per_token(model: CausalLM, seq_len: int | None = None) -> dict[str, float]:
    """Training FLOPs per token: ``6 N`` (N = every parameter except the input-embedding lookup) plus the
    attention term ``6 * 2 * L * d * keys``, where ``keys`` is the mean number of keys a query scores for the
    layer's variant (causal: (T+1)/2; windows: fewer), plus products a variant does beyond its parameters
    (DAR's second pass through ``query_key_value``). Forward is one third of each term."""
    cfg = model.cfg
    T = seq_len or cfg.seq_length
    n = count_parameters(model)["non_embedding"]
    # per query and layer: q.k scores and probs.v, 2 FLOPs per multiply-add each, over d = H * d_h dims
    attn = sum(6 * 2 * cfg.hidden_size * m.attended_keys(T) + m.extra_flops_per_token()
               for m in model.attention_modules())
    return {"params": 6.0 * n, "attention": float(attn), "total": 6.0 * n + float(attn)}
