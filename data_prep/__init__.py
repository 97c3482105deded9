"""Corpus preparation: ``python -m data_prep.tokenize`` writes GPT-NeoX/Megatron ``.bin/.idx`` datasets."""
