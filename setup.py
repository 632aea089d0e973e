"""Build hook for the optional C extensions (everything else is in pyproject.toml).

shardpack.images.libjpegcrop decodes only a training crop's region of a JPEG with the system
libjpeg-turbo (docs/device.md, "Region decode").  shardpack.format.libxxh3ranges hashes a batch's
samples with the system libxxhash in one call that releases the GIL (docs/reading.md,
"Integrity").  shardpack.images.formats.libpixels crops and resizes a batch's raw pixels (pack
--pixels raw) in one call (docs/images.md, "Raw pixels").  All are optional: without a C compiler or the headers (Debian: gcc
libjpeg62-turbo-dev libxxhash-dev) the install goes on without them; JPEGs then decode the way
they do without it (simplejpeg at a DCT scale), after one notice, and samples are hashed one
xxhash call each (the same digests), and raw pixels are cropped one sample at a time (the same
pixels).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("shardpack.images.libjpegcrop", ["shardpack/images/libjpegcrop.c"],
              libraries=["jpeg"], extra_compile_args=["-O2"], optional=True),
    Extension("shardpack.format.libxxh3ranges", ["shardpack/format/libxxh3ranges.c"],
              libraries=["xxhash"], extra_compile_args=["-O2"], optional=True),
    # -ffp-contract=off: the crop's draws must round as Python's arithmetic does (no fused
    # multiply-add), so a sample crops the same here as on every other path.
    Extension("shardpack.images.formats.libpixels", ["shardpack/images/formats/libpixels.c"],
              libraries=["xxhash", "m"], extra_compile_args=["-O3", "-ffp-contract=off"],
              optional=True),
])
