"""One module per image format, each defining its :class:`~shardpack.images.formats.base.Codec`
(docs/design.md, "Adding an image format"); :mod:`shardpack.images.registry` lists them."""
