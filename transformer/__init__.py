"""A readable, tested implementation of the Transformer of "Attention Is All You Need"."""

from transformer.config import Config, ConfigError
from transformer.config_loading import load_config

__all__ = ["Config", "ConfigError", "Transformer", "Translator", "load_config"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # the model pulls in torch (about a second), Translator the tokenizer and datasets as well: imported when asked
    # for, so that the console scripts (`transformer.console`) start before torch loads
    if name == "Transformer":
        from transformer.model.transformer import Transformer

        return Transformer
    if name == "Translator":
        from transformer.decoding.translator import Translator

        return Translator
    raise AttributeError(f"module 'transformer' has no attribute {name!r}")
