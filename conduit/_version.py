"""Conduit's version, in a leaf module: the package, checkpoints and the CLI read it without importing the runtime."""

__version__ = "0.1.0"
