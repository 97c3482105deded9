"""The models' inference code, standalone: plain PyTorch that imports nothing from ``neox_dar`` (only ``torch``, and
``transformers`` where named; the modules import each other relatively), because ``convert to-hf`` copies every file
here verbatim (:mod:`.layer_types` aside) beside the weights of an exported variant model, where ``from_pretrained(..., trust_remote_code=True)``
runs them without neox-dar.

* :mod:`.rotary`: rotary tables; :mod:`.cache`: where a batch's tokens are in the caches (``Layout``), the ring
  buffers, the key/value cache of softmax attention and the caches of a model (``ModelCache``);
* :mod:`.attention`: the families' attention projections and :class:`~.attention.AttentionLayer`, the base of every
  attention layer type;
* one module per attention layer type, its parameters, cache and decode step: :mod:`.windowed` (vanilla, SWA, MSWA),
  :mod:`.dar` (DAR, uniform), :mod:`.aha`, :mod:`.linear`, :mod:`.dimpo`;
* :mod:`.decoder`: the MLPs, the decoder layer (names and residual wiring) and the stack, with the decode step
  through the caches; :mod:`.norms`: LayerNorm and RMSNorm;
* :mod:`.block`: ``neox_dar_block`` of ``config.json``, the family's layer shape, as a typed record;
* :mod:`.layer_types`: the layer types by name, every one a module here defines (an export writes its own, which
  imports each of them by name);
* ``configuration_neox_dar.py``, ``modeling_neox_dar.py``: the ``transformers`` config and model classes the exported
  ``config.json`` names in ``auto_map``.

neox-dar's model builds on :mod:`.decoder`, and each attention module of ``neox_dar.attention`` subclasses the layer
type it computes, so training, ``neox_dar.generate`` and the export run one implementation. This package file
imports nothing, so neox-dar imports these modules without ``transformers``.
"""
