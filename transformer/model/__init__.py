"""The model of the paper (Figure 1): attention (§3.2), the layers around it (§3.1, §3.3-3.5), the Transformer."""

from transformer.model.transformer import Transformer

__all__ = ["Transformer"]
