"""HexStudio: a deployment studio for LLMs on Qualcomm Hexagon NPUs."""

__version__ = "0.1.0"
