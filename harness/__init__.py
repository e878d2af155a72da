"""quantgate: decide whether a quantized LLM may ship."""

__version__ = "0.1.0"
