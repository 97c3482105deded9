"""The Hugging Face bridge: neox-dar models to and from folders of the families' classes (:mod:`neox_dar.families`:
``GPTNeoXForCausalLM``, ``LlamaForCausalLM``, ``Olmo2ForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``);
its command line is ``python -m neox_dar.convert`` (:mod:`neox_dar.convert`). Modules: :mod:`.config_map`
(``config.json`` both ways), :mod:`.weights` (reading a folder's tensors), :mod:`.remote` (the exported code of a
model with other attention), :mod:`.folders` (``to_hf``, ``from_hf`` and the output folders they may write); the
tokenizer files go with :mod:`neox_dar.tokenizer`.

Parameter names are each class's own (:mod:`neox_dar.model`), so nothing is renamed except GPT-NeoX's output head:
exports write ``embed_out.weight`` (the published Pythia name, which transformers 5 maps to ``lm_head.weight`` on
load); imports accept both. ``from-hf`` maps ``config.json`` to our model config (one-line errors for a class or a
setting we cannot honour, or sizes the weight files cannot hold, before any tensor is read; weights only from inside
the folder, and only finite floating-point tensors), builds the model on the meta device and assigns the tensors of
one safetensors shard at a time, memory-mapped (a checkpoint loads in about one model's worth of memory, in its own
dtype), and copies the folder's tokenizer files. ``key=value`` overrides add a variant on top of the imported model
(``attention_type=dar``): its new parameters get the model's ``init_method`` (docs/models.md).

``to-hf`` writes a complete folder: ``config.json``, ``model.safetensors``, the run's tokenizer (the tokenizer
files beside the checkpoint, else the config's ``vocab_file``, else the bundled Pythia tokenizer), the tokenizer's
``tokenizer_config.json``/``special_tokens_map.json`` (imported ones are kept; otherwise bos = eos = unk =
``<|endoftext|>``) and ``generation_config.json`` (which suppresses the vocabulary's padding ids). A vanilla model
exports as the family's class; a model with any other attention layer as ``NeoxDarForCausalLM``, whose code
(every module of :mod:`neox_dar.standalone`: ``modeling_neox_dar.py``, ``configuration_neox_dar.py`` and the
inference code they import, one module per attention layer type, with a ``layer_types.py`` that imports every layer
type by name) is copied into the folder and named by ``auto_map`` in ``config.json``, for ``from_pretrained(..., trust_remote_code=True)``
(docs/inference.md). Both carry the model config under ``neox_dar_config``, which ``from-hf`` reads back.

``OUT_DIR`` must be new, empty, or an earlier output of the same command for a model of the same config (a newer
checkpoint of the same run exported again), which is then replaced; a run directory, a folder of other files or
another model's export or import is a one-line error naming it (:func:`~.folders.check_out_dir`).
"""

from .config_map import config_from_hf, export_problems, hf_config_dict
from .folders import check_out_dir, folder_model, from_hf, to_hf
from .remote import REMOTE_CODE, REMOTE_FILES, remote_config_dict
from .weights import vanilla_weight_names, weight_files
