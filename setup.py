"""Build hook for the optional C extension (everything else is in pyproject.toml).

shardpack.images.libjpegcrop decodes only a training crop's region of a JPEG with the system
libjpeg-turbo (docs/device.md, "Region decode").  It is optional: without a C compiler or the
libjpeg headers (Debian: gcc libjpeg62-turbo-dev) the install goes on without it, and JPEGs
decode the way they do without it (simplejpeg at a DCT scale), after one notice.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("shardpack.images.libjpegcrop", ["shardpack/images/libjpegcrop.c"],
                             libraries=["jpeg"], extra_compile_args=["-O2"], optional=True)])
