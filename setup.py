"""The one thing pyproject.toml cannot say stably yet: Conduit's optional C extension.

``conduit._stream`` copies with non-temporal stores (conduit.storage.streaming says
why and what it measured). It is optional: where no C compiler is found the build
skips it with a warning, and Conduit copies with numpy instead.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("conduit._stream", sources=["conduit/_stream.c"], optional=True)])
