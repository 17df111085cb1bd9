"""quarl: quantization-enhanced RL of LLMs."""

__version__ = "0.1.0"
