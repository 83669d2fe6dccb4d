"""A readable, tested implementation of the Transformer of "Attention Is All You Need"."""

from transformer.config import Config, ConfigError
from transformer.config_loading import load_config
from transformer.model.transformer import Transformer

__all__ = ["Config", "ConfigError", "Transformer", "Translator", "load_config"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Translator pulls in the tokenizer and datasets: import it only when asked for
    if name == "Translator":
        from transformer.decoding.translator import Translator

        return Translator
    raise AttributeError(f"module 'transformer' has no attribute {name!r}")
