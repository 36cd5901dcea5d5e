"""Integrations of flashattn with other libraries.

flashattn.integrations.transformers: registers flashattn as an attention implementation of
Hugging Face transformers (``register()`` returns the name to pass as ``attn_implementation``).
Each integration imports its library only when it is imported itself.
"""
