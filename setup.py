"""The one thing pyproject.toml cannot say stably yet: Conduit's optional C extension.

``conduit._native`` holds the few kernels where numpy's per-call cost or its choice
of instructions is what a replay buffer waits for: a copy with non-temporal stores
(conduit.storage.streaming says why) and the prioritized
sampler's sum-tree (conduit.samplers.sumtree). It is optional: where no C compiler
is found the build skips it with a warning, and Conduit uses numpy instead.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("conduit._native", sources=["conduit/_native.c"], optional=True)])
