"""A readable, tested implementation of the Transformer of "Attention Is All You Need"."""

from transformer.config import Config, ConfigError, load_config
from transformer.model import Transformer

__all__ = ["Config", "ConfigError", "Transformer", "load_config"]
__version__ = "0.1.0"
