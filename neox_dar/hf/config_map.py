"""A Hugging Face ``config.json`` and our model config, both ways: the family's class keys (:mod:`neox_dar.families`),
rotary settings of transformers 4 and 5, the sizes the weight files must hold, and what a class cannot express."""

from __future__ import annotations

import dataclasses
import math
import warnings

from ..config import ConfigError, model_config_from_flat, model_flat, ModelConfig
from ..config.schema import key_sections
from ..families import FAMILIES
from ..notices import Notice

LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope(hf: dict, where: str) -> tuple[float, dict | None, float | None]:
    """``(theta, llama3 scaling or None, partial rotary factor or None)`` from transformers 5's
    ``rope_parameters`` or transformers 4's ``rope_theta``/``rope_scaling``, read as transformers 5 reads them: a
    non-empty ``rope_scaling`` replaces ``rope_parameters`` whole, and a key the mapping lacks comes from the
    top-level ``rope_theta`` (then GPT-NeoX's ``rotary_emb_base``, then 10000)."""
    params, scaling = hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {key!r} must be a mapping, got {value!r}")
    rope = scaling or params
    kind = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000)))
    if kind not in ("default", "llama3"):
        raise ConfigError(f"{where}: rope type {kind!r} is not supported (default, llama3)")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < math.inf:
        raise ConfigError(f"{where}: rope_theta must be a positive number, got {theta!r}")
    llama3 = None
    if kind == "llama3":
        if missing := [k for k in LLAMA3_KEYS if k not in rope]:
            raise ConfigError(f"{where}: llama3 rope scaling lacks {', '.join(map(repr, missing))}")
        llama3 = {k: rope[k] for k in LLAMA3_KEYS}
    theta = int(theta) if float(theta).is_integer() else theta  # rotary_emb_base is GPT-NeoX's int
    return theta, llama3, rope.get("partial_rotary_factor")



def _size(hf: dict, key: str, where: str, default: int | None = None) -> int:
    """``hf[key]`` (``default`` when absent or null) as a positive int (``1e7`` reads as 10000000); a ConfigError
    when it is missing or not a positive whole number."""
    value = hf.get(key)
    value = default if value is None else value
    if value is None:
        raise ConfigError(f"{where}: {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1 \
            or (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    return int(value)



LEFT_OUT_SIZES = ("num_key_value_heads", "intermediate_size", "max_position_embeddings", "head_dim")


def _class_sizes(hf_class: str, hf: dict, hidden: int, heads: int, where: str) -> dict:
    """For each of :data:`LEFT_OUT_SIZES` that ``hf`` lacks (or holds as null), what the family's transformers config
    class makes of the file: its default, which may follow the width and heads (Llama's key/value heads are the heads,
    Qwen2's default to 32; Llama's head_dim is the width over the heads, Qwen3's 128); None where the class has no
    such key (GPT-NeoX's key/value heads and head_dim)."""
    missing = [k for k in LEFT_OUT_SIZES if hf.get(k) is None]
    if not missing:
        return {}
    import transformers  # only for a file that leaves a size out: every published config.json has them

    null = {"num_key_value_heads": None} if "num_key_value_heads" in hf else {}  # null: the heads (Qwen2's too)
    cls = getattr(transformers, hf_class.replace("ForCausalLM", "Config"))
    try:
        made = cls(hidden_size=hidden, num_attention_heads=heads, **null)
    except Exception as e:  # noqa: BLE001 - its own checks raise their own classes (huggingface_hub's in 5)
        raise ConfigError(f"{where}: {cls.__name__} refuses hidden_size {hidden} with {heads} heads "
                          f"({str(e).strip().splitlines()[-1].strip()})") from None
    return {k: getattr(made, k, None) for k in missing}


def _check_size(keys: dict, weight_bytes: int | None, where: str) -> None:
    """ConfigError when the model of ``keys`` (flat, before validation) holds more parameters than ``weight_bytes``
    of weight files can store (one byte each at the least): wrong sizes are caught before anything is built.

    The bound counts only what every family has: the embedding (vocab x hidden) and, per layer, the query
    projection (hidden x heads * head_dim) and the MLP (hidden x intermediate); a size that is absent or not a
    positive int counts as 1 (the config's own validation reports it)."""
    def n(key: str) -> int:
        value = keys.get(key)
        return value if type(value) is int and value > 0 else 1

    width = n("num_attention_heads") * n("head_dim") if keys.get("head_dim") else n("hidden_size")
    least = n("vocab_size") * n("hidden_size") + n("num_layers") * n("hidden_size") * (width + n("intermediate_size"))
    if weight_bytes is not None and least > weight_bytes:
        raise ConfigError(f"{where} describes a model of at least {least:,} parameters, but its weight files hold "
                          f"{weight_bytes:,} bytes: its weight files are incomplete (a download cut short?) or its "
                          "sizes (num_hidden_layers, hidden_size, vocab_size, ...) are wrong")



LAYOUT_KEYS = ("attention_type", "attention_config", "hybrid")  # which variant each layer computes
# the sizes every export writes to config.json (shape_keys) and an import checks again (_edited_after_export):
# config.json's key -> ours
SIZE_KEYS = {"hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
             "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_kv_heads",
             "head_dim": "head_dim", "intermediate_size": "intermediate_size",
             "max_position_embeddings": "max_position_embeddings"}


def config_from_hf(hf: dict, where: str = "config.json", overrides: dict | None = None,
                   weight_bytes: int | None = None) -> ModelConfig:
    """Our model config for a Hugging Face ``config.json`` (``overrides``: flat keys on top, given on the command
    line, e.g. a variant; one that sets any of :data:`LAYOUT_KEYS` replaces the import's layer layout whole, so
    ``attention_config`` alone is not refused for conflicting with the import's ``attention_type``).

    Exports of this project carry their own model config (``neox_dar_config``; exports of older versions carried
    the whole run config there, whose non-model keys are dropped); where the folder's own ``config.json`` keys say
    otherwise (it was changed by transformers after the export: ``resize_token_embeddings``, an edited epsilon),
    those win, as transformers runs them, each with a warning (:func:`_edited_after_export`). ``weight_bytes``: the
    size of the folder's weight files, which must be able to hold the model (:func:`_check_size`, before the config
    is validated)."""
    overrides = overrides or {}
    said = {k.replace("-", "_"): "the command line" for k in overrides}  # where an override's mistake is
    if not isinstance(hf, dict):
        raise ConfigError(f"{where} must hold a JSON object, not a {type(hf).__name__}")
    if "neox_dar_config" in hf:
        if not isinstance(hf["neox_dar_config"], dict):
            raise ConfigError(f"{where}: 'neox_dar_config' must be a mapping of model config keys, got "
                              f"{hf['neox_dar_config']!r}")
        sections = key_sections()
        keys = _under(overrides, {k: v for k, v in hf["neox_dar_config"].items()
                                  if sections.get(k) in ("model", "attention")})
        source = f"{where}:neox_dar_config"
        _check_size({**keys, **overrides}, weight_bytes, where)
        with warnings.catch_warnings(record=True) as caught:  # the config's own warnings: from the config imported
            warnings.simplefilter("always")
            cfg = model_config_from_flat({**keys, **overrides}, source=source, sources=said)
            exported = model_config_from_flat(keys, source=source) if overrides else cfg
        # config.json against the export's own config: a key the command line sets is neither an edit nor warned
        edits = _edited_after_export(hf, exported, where, set(said))
        if not edits:
            for w in caught:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            return cfg
        _check_size({**keys, **edits, **overrides}, weight_bytes, where)
        return model_config_from_flat({**keys, **edits, **overrides}, source=source, sources=said)
    # a config.json without architectures (older Pythia ones) is the family its model_type names
    typed = FAMILIES.get(hf["model_type"]) if isinstance(hf.get("model_type"), str) else None
    archs = hf.get("architectures") or [typed.hf_class if typed else "?"]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ConfigError(f"{where}: 'architectures' must be a list of class names such as [\"LlamaForCausalLM\"], "
                          f"got {archs!r}")
    family = next((f for f in FAMILIES.values() if f.hf_class == archs[0]), None)
    if family is None:
        raise ConfigError(f"{where}: architectures {archs} is not supported (supported: "
                          f"{', '.join(f.hf_class for f in FAMILIES.values())})")
    theta, llama3, partial = _rope(hf, where)
    vocab, hidden, heads = (_size(hf, k, where) for k in ("vocab_size", "hidden_size", "num_attention_heads"))
    assumed = _class_sizes(family.hf_class, hf, hidden, heads, where)
    positions = _size(hf, "max_position_embeddings", where, assumed.get("max_position_embeddings"))
    keys = {
        "model_family": family.name,
        "num_layers": _size(hf, "num_hidden_layers", where),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": _size(hf, "num_key_value_heads", where, assumed.get("num_key_value_heads") or heads),
        "intermediate_size": _size(hf, "intermediate_size", where, assumed.get("intermediate_size")),
        "max_position_embeddings": positions,
        "seq_length": min(2048, positions),
        "rotary_emb_base": theta,
        "rope_scaling": llama3,
        "vocab_size": vocab,
        "make_vocab_size_divisible_by": 128 if vocab % 128 == 0 else 1,
        "no_weight_tying": not hf.get("tie_word_embeddings", False),
        "init_method_std": hf.get("initializer_range", 0.02),
    }
    if hf.get("head_dim") or assumed.get("head_dim") not in (None, hidden // heads):
        keys["head_dim"] = hf.get("head_dim") or assumed["head_dim"]
    _check_size({**keys, **overrides}, weight_bytes, where)
    act = hf.get("hidden_act", family.hidden_act)
    if act != family.hidden_act:
        raise ConfigError(f"{where}: hidden_act {act!r} is not supported for {family.hf_class} (only "
                          f"{family.hidden_act!r})")
    layer_types = hf.get("layer_types") or ()
    windowed = hf.get("use_sliding_window", hf.get("sliding_window") is not None)  # Qwen's switch, else the window
    if windowed or "sliding_attention" in (layer_types if isinstance(layer_types, list) else ()):
        raise ConfigError(f"{where}: sliding_window (use_sliding_window) / sliding_attention layers are not "
                          "supported; use our attention_type: swa on a full-attention import instead")
    dropped = {k: hf[k] for k in ("attention_dropout", "hidden_dropout") if isinstance(hf.get(k), (int, float))
               and hf[k] and not (k == "hidden_dropout" and any(k in h.ours and h.read for h in family.hf_keys))}
    if dropped:
        warnings.warn(f"{where}: {', '.join(f'{k} {v}' for k, v in dropped.items())} not imported: the import trains "
                      "without dropout (inference is the same); set hidden_dropout=... on the command line to train "
                      "with it (attention_dropout must stay 0 here)", Notice, stacklevel=2)
    keys.update(family.fixed, **family.import_keys)
    for key in family.hf_keys:
        for ours in key.ours if key.read else ():
            keys[ours] = hf[key.hf] if key.hf in hf else keys.get(ours, key.default)
    if partial is not None and "rotary_pct" in family.fixed:  # the class rotates every dim whatever it says
        if partial != family.fixed["rotary_pct"]:
            warnings.warn(f"{where}: partial_rotary_factor {partial!r} is ignored: {family.hf_class} rotates "
                          f"rotary_pct={family.fixed['rotary_pct']} of each head, whatever its config says, and so "
                          "does the import", Notice, stacklevel=2)
    elif partial is not None:  # rope_parameters' partial_rotary_factor before GPT-NeoX's rotary_pct, as transformers 5
        keys["rotary_pct"] = partial
    return model_config_from_flat({**keys, **overrides}, source=where, sources=said)


def _under(overrides: dict, keys: dict) -> dict:
    """``keys`` without its :data:`LAYOUT_KEYS` when ``overrides`` set any of them (the override's layout replaces
    the import's)."""
    if not any(k in overrides for k in LAYOUT_KEYS):
        return keys
    return {k: v for k, v in keys.items() if k not in LAYOUT_KEYS}


def _edited_after_export(hf: dict, cfg: ModelConfig, where: str, overridden: set[str]) -> dict:
    """Flat keys for what ``config.json``'s own keys say differently from its ``neox_dar_config`` (``cfg``): the
    sizes every export writes (:func:`shape_keys`) and, for the family's class, its ``config.json`` keys
    (:attr:`~neox_dar.families.Family.hf_keys`) and rotary settings. transformers keeps ``neox_dar_config`` when it
    saves a folder it loaded, and runs its own keys; each difference is warned, except those whose keys of ours
    the command line sets (``overridden``: its value wins, and nothing of config.json is imported for it)."""
    family = FAMILIES.get(cfg.model_family)
    found: list[tuple[str, object, object, dict]] = []  # (config.json key, its value, ours, the keys that follow it)
    for hf_key, ours in SIZE_KEYS.items():
        if hf.get(hf_key) is not None and hf[hf_key] != getattr(cfg, ours):
            found.append((hf_key, hf[hf_key], getattr(cfg, ours), {ours: hf[hf_key]}))
    if hf.get("vocab_size") is not None and hf["vocab_size"] != cfg.padded_vocab_size:
        found.append(("vocab_size", hf["vocab_size"], cfg.padded_vocab_size,
                      {"vocab_size": hf["vocab_size"], "make_vocab_size_divisible_by": 1}))
    if isinstance(hf.get("tie_word_embeddings"), bool) and hf["tie_word_embeddings"] == cfg.no_weight_tying:
        found.append(("tie_word_embeddings", hf["tie_word_embeddings"], not cfg.no_weight_tying,
                      {"no_weight_tying": not hf["tie_word_embeddings"]}))
    if family is not None and (hf.get("architectures") or [None])[0] == family.hf_class:
        for key in family.hf_keys:
            ours = [o for o in key.ours if getattr(cfg, o) != hf.get(key.hf, getattr(cfg, o))] if key.read else []
            if ours:
                found.append((key.hf, hf[key.hf], getattr(cfg, ours[0]), {o: hf[key.hf] for o in key.ours}))
        theta, llama3, partial = _rope(hf, where)
        scaling = None if cfg.rope_scaling is None else {k: getattr(cfg.rope_scaling, k) for k in LLAMA3_KEYS}
        partial = None if "rotary_pct" in family.fixed else partial  # the class ignores it (config_from_hf)
        for name, value, current, ours in (("rope_theta", theta, cfg.rotary_emb_base, "rotary_emb_base"),
                                           ("rope_scaling", llama3, scaling, "rope_scaling"),
                                           ("partial_rotary_factor", partial, cfg.rotary_pct, "rotary_pct")):
            if value != current and (value is not None or name == "rope_scaling"):
                found.append((name, value, current, {ours: value}))
    found = [f for f in found if not overridden & set(f[3])]
    for hf_key, value, current, _ in found:
        warnings.warn(f"{where}: {hf_key} is {value!r} but its neox_dar_config says {current!r} (the folder was "
                      "changed after its export, e.g. by transformers): importing config.json's value, as "
                      "transformers runs it", Notice, stacklevel=3)
    return {k: v for *_, keys in found for k, v in keys.items()}



def export_problems(cfg: ModelConfig) -> list[str]:
    """What the family's Hugging Face class cannot express of ``cfg`` (empty when the export is faithful)."""
    family = FAMILIES[cfg.model_family]
    problems = [f"{k}={getattr(cfg, k)!r} (the class needs {v!r})" for k, v in family.fixed.items()
                if getattr(cfg, k) != v]
    for key in family.hf_keys:
        if len({getattr(cfg, ours) for ours in key.ours}) > 1:
            problems.append(f"{' != '.join(key.ours)} (the class has one {key.hf})")
    return problems



def shape_keys(cfg: ModelConfig, special_ids: dict[str, int | None]) -> dict:
    """The ``config.json`` keys of every export: sizes, tying, the tokenizer's bos/eos ids, dtype, and our model
    config (``neox_dar_config``, which ``from-hf`` reads back)."""
    return {
        "vocab_size": cfg.padded_vocab_size,
        **{hf_key: getattr(cfg, ours) for hf_key, ours in SIZE_KEYS.items()},
        "tie_word_embeddings": not cfg.no_weight_tying,
        "initializer_range": cfg.init_method_std,
        "bos_token_id": special_ids["bos"],
        "eos_token_id": special_ids["eos"],
        "torch_dtype": "float32",
        "neox_dar_config": model_flat(cfg),
    }



def hf_config_dict(cfg: ModelConfig, special_ids: dict[str, int | None] | None = None) -> dict:
    """The ``config.json`` of the family's Hugging Face class equal to ``cfg``'s vanilla model; ``special_ids``:
    the tokenizer's ``{"bos", "eos"}`` ids (default: ``<|endoftext|>`` = 0 of the Pythia tokenizer)."""
    special_ids = special_ids or {"bos": 0, "eos": 0}
    family = FAMILIES[cfg.model_family]
    rope = {"rope_type": "default", "rope_theta": float(cfg.rotary_emb_base)}
    if cfg.rope_scaling is not None:
        rope = {**rope, **dataclasses.asdict(cfg.rope_scaling)}
    params = rope if "rotary_pct" in family.fixed else {**rope, "partial_rotary_factor": cfg.rotary_pct}
    return {
        "architectures": [family.hf_class],
        "model_type": family.name,
        **shape_keys(cfg, special_ids),
        "attention_dropout": cfg.attention_dropout,
        # transformers 4 reads rope_theta / rope_scaling, transformers 5 rope_parameters
        "rope_theta": float(cfg.rotary_emb_base),
        "rope_scaling": rope if cfg.rope_scaling is not None else None,
        "rope_parameters": params,
        "hidden_act": family.hidden_act,
        **{key.hf: getattr(cfg, key.ours[0]) for key in family.hf_keys},
        **family.hf_extra,
    }
