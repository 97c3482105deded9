"""The built-in variants' specs: what each declares to the rest of the project (``attention_type`` name, config
keys and rules, model-dependent defaults, descriptions, statistics), without torch.

The config package loads, checks and describes configs from these alone, so it never imports torch; each spec's
:meth:`~.base.Spec.module` imports the variant's torch module (``neox_dar/attention/<name>.py``) when a model is
built. See ``docs/adding_a_variant.md``.
"""
