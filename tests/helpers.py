"""Test helpers importable from test modules."""

from tests.conftest import cuda_only, transitions

__all__ = ["cuda_only", "transitions"]
