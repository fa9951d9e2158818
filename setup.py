"""The one thing pyproject.toml cannot declare stably: the compiled loops of `kvtool analyze`.

``optional=True``: where no C compiler is at hand the install goes on without them, and analyze runs the numpy
versions of the same steps (kvtool/events/kernels.py).  Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvtool.events._kernels",
            sources=["kvtool/events/_kernels.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
