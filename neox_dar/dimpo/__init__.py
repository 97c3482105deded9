"""DimPO: post-hoc low-dimensional query/key projections of vanilla attention, and the baselines of the paper
("DimPO: Dimensionality Reduction for Attention using Preference Optimization", Sec. 3-4, Appendix A).

Per layer one bias-free ``W`` (d' x d_h), shared by all heads, applied to the rotary-embedded queries and keys;
projected logits ``F(q) F(k)^T / sqrt(d')``. docs/dimpo.md states every choice the paper leaves open.

* :mod:`.losses`: DimPO's listwise loss, SimPO, ORPO, CPO, the triplet loss; KL and output-error metrics
* :mod:`.instances`: documents, one layer's streamed instances (:class:`LayerSplit`)
* :mod:`.methods`: ``random``, ``pca`` and the trained methods behind one :func:`fit_projection`
* :mod:`.evaluate`: KL and MSE of many projections in one pass
* :mod:`.fit`: Table 1, layer by layer, resumable
* :mod:`.projections`: projection files, the layers they apply to, the KV-cache saving
* :mod:`.tasks`, :mod:`.tables`: Tables 2-3 through lm-eval, and every table in Markdown and LaTeX
* :mod:`.files`: reading the JSON result files

Command line: ``python -m neox_dar.dimpo {fit,table,tasks} ...`` (see :mod:`.__main__`).
"""

from .evaluate import evaluate
from .instances import DimPOError, Documents, LayerSplit, capture_split, layer_qkv, select_documents
from .losses import cpo_loss, dimpo_loss, kl_per_query, orpo_loss, output_se_per_query, simpo_loss, triplet_loss
from .methods import METHODS, PAPER, fit_projection, pca_projection, random_projection
from .projections import (Projections, check_projections, kv_cache_saving, load_projections, model_shape,
                          projected_layers)

__all__ = ["METHODS", "PAPER", "DimPOError", "Documents", "LayerSplit", "Projections", "capture_split",
           "check_projections", "cpo_loss", "dimpo_loss", "evaluate", "fit_projection", "kl_per_query",
           "kv_cache_saving", "layer_qkv", "load_projections", "model_shape", "orpo_loss", "output_se_per_query",
           "pca_projection", "projected_layers", "random_projection", "select_documents", "simpo_loss",
           "triplet_loss"]
