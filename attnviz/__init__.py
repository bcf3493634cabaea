"""attnviz: see, measure and verify multi-head attention in Hugging Face transformers."""

__version__ = "0.1.0"
