"""Code shipped with Hugging Face exports of variant models (``trust_remote_code``), and only that.

Each module here imports nothing from ``neox_dar`` (only ``torch``, and ``transformers`` where named), because
``convert to-hf`` copies the files verbatim into the exported folder:

* :mod:`.inference`: rotary, the per-layer inference caches and the attention that reads them. The attention modules
  of ``neox_dar.attention`` decode through it too, so the exported model and ``neox_dar.generate`` run the same code.
* ``configuration_neox_dar.py``, ``modeling_neox_dar.py``: the ``transformers`` config and model classes the exported
  ``config.json`` names in ``auto_map``.

This package file imports nothing, so ``neox_dar.attention`` can import :mod:`.inference` without ``transformers``.
"""
