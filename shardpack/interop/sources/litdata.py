"""LitData (``litdata.optimize``) datasets -> samples.

``index.json`` holds ``chunks`` (filename, chunk_size = items, chunk_bytes) and ``config``:
``data_format`` (one serializer name per pytree leaf, e.g. ``["jpeg", "int"]``), ``data_spec``
(the torch pytree spec of a sample, as JSON), ``compression`` / ``compression_level``,
``encryption`` and ``item_loader``.  A chunk is::

    uint32 n | uint32 offsets[n + 1] (from the file start) | items

and an item is one ``uint32`` size per leaf, then the leaves' bytes in leaf order.  With
``compression="zstd"`` the chunk is either a whole zstd file (``compression_level`` "chunk":
``chunk_bytes`` is the decompressed size), a framed file (level "batch": ``LDFZ01`` header,
the items' offsets, a frame table with each frame's decompressed size, then zstd frames), or a
classic chunk whose items are each one zstd frame (level "sample").  Uncompressed chunks become
byte ranges; compressed ones are decompressed one chunk (or item) at a time, bounded by the
sizes recorded, and carried inline.

Field names: the sample dict's keys (a tuple or list: the leaf index, ``0``, ``1``...; a bare
leaf: ``data``), plus an extension from the serializer (see ``_leaf``).  Nested pytrees,
encrypted datasets and item loaders other than PyTreeLoader are refused.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Iterator, NamedTuple

import numpy as np

from shardpack.core.errors import SourceError
from shardpack.format import unsafe_name_reason
from shardpack.write.samples import SourceField
from shardpack.interop.sources.base import ContainerSource, inline
from .common import ZSTD_MAGIC, ByteRanges, Memory, Window, check_expansion, check_fields, \
    decimal, decompress, field_name, npy, pil_to_png, zstd_frame_size
from shardpack.interop.sources.litdata_json import to_json

CARRIED = {"bytes": None, "str": "txt", "text": "txt", "jpeg": "jpg", "pdf": "pdf",
           "tiff": "tiff", "tifffile": "tiff", "pickle": "pkl", "graph:pickle": "pkl"}
MEDIA = {"image": "jpg", "file": None, "video": "mp4", "audio": "wav", "mesh": "glb",
         "nifti": "nii"}  # kind:ext, raw file bytes; the default when the ext is missing
SCALARS = {"int": "<i8", "float": "<f8", "bool": "|b1"}
NUMPY = ["|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8", "<c8",
         "<c16", "|b1"]  # LitData's numpy dtype numbers (object/bytes/str/void have no form)
TORCH = {0: "<f4", 1: "<f4", 2: "<f8", 3: "<f8", 4: "<c8", 5: "<c8", 6: "<c16", 7: "<c16",
         8: "<f2", 9: "<f2", 11: "|u1", 12: "|i1", 13: "<i2", 14: "<i2", 15: "<i4", 16: "<i4",
         17: "<i8", 18: "<i8", 19: "|b1", 20: "<u2"}  # 10 is bfloat16: no numpy dtype
KNOWN = sorted(set(CARRIED) | set(SCALARS) | {f"{k}:EXT" for k in MEDIA} | {
    "pil", "json", "numpy", "no_header_numpy:N", "tensor", "no_header_tensor:N"})
FRAMED_MAGIC = b"LDFZ01\0\0"
FOOTER_MAGIC = b"LDARW01\0"
_PREFIX, _FRAME = struct.Struct("<8sHHIII"), struct.Struct("<IIQII")


class Leaf(NamedTuple):
    """One leaf of a LitData sample: its key ``name``, the ``field`` it becomes, its serializer
    ``format``, how it is carried (``kind``) and the ``dtype`` of a scalar or header-less array."""

    name: str
    field: str
    format: str
    kind: str        # carried, scalar, pil, json, numpy, tensor
    dtype: str | None = None  # scalar dtype, or the dtype of a header-less 1-D array


class LitDataSource(ContainerSource):
    """A LitData ``optimize()`` output (index.json and chunk ``.bin`` files): every sample of
    every chunk, each leaf a field (docs/convert.md, "LitData")."""

    format = "litdata"
    suffixes = (".bin",)

    def __init__(self, src, **kwargs):
        super().__init__(src, **kwargs)
        index, shown = self.read_json("index.json")
        if not isinstance(index, dict) or not isinstance(index.get("chunks"), list) \
                or not isinstance(index.get("config"), dict):
            raise SourceError("not a LitData index: expected an object with 'chunks' (a list) "
                              "and 'config'", path=shown)
        self._configure(index["config"], shown)  # refusals come before anything is written
        self.chunks, self.shown = index["chunks"], shown

    def samples(self) -> Iterator[tuple[str | None, list[SourceField], str]]:
        """``(None, fields, where)`` of each item of each chunk, in index order."""
        for chunk in self.chunks:
            yield from self._chunk(chunk, self.shown)

    def _configure(self, config: dict, shown: str) -> None:
        loader = config.get("item_loader", "PyTreeLoader")
        if loader != "PyTreeLoader":
            raise SourceError(f"unsupported item_loader: expected 'PyTreeLoader', found "
                              f"{loader!r}", path=shown)
        if config.get("encryption"):
            raise SourceError("the dataset is encrypted: not supported", path=shown)
        self.compression = config.get("compression")
        if self.compression is not None and (not isinstance(self.compression, str)
                                             or self.compression.split(":", 1)[0] != "zstd"):
            raise SourceError(f"unsupported compression: expected 'zstd' or none, found "
                              f"{self.compression!r}", path=shown)
        self.level = config.get("compression_level") or "chunk"
        if self.level not in ("chunk", "batch", "sample"):
            raise SourceError(f"unsupported compression_level: expected chunk, batch or sample, "
                              f"found {self.level!r}", path=shown)
        formats = config.get("data_format")
        if not isinstance(formats, list) or not formats \
                or not all(isinstance(f, str) for f in formats):
            raise SourceError("config.data_format must be a non-empty list of serializer names",
                              path=shown)
        names = _leaf_names(config.get("data_spec"), len(formats), shown)
        self.leaves = [self._leaf(n, f, shown) for n, f in zip(names, formats, strict=True)]
        check_fields([leaf.field for leaf in self.leaves], names, "LitData key", shown)
        if self.compression:
            self.note(f"LitData chunks were compressed ({self.compression}, level "
                      f"{self.level}); fields were decompressed")
        for leaf in self.leaves:
            how = _CONVERTED.get(leaf.kind) or _CONVERTED.get(leaf.format)
            if how:
                self.note(f"LitData key {leaf.name!r} ({leaf.format}) -> field {leaf.field!r} "
                          f"({how})")

    def _leaf(self, name: str, fmt: str, shown: str) -> Leaf:
        kind, _, arg = fmt.partition(":")
        if fmt in ("pickle", "graph:pickle") and not self.allow_pickle:
            raise SourceError(f"key {name!r} uses the {fmt!r} serializer: unpickling runs code "
                              "from the file, so it is refused", path=shown,
                              hint="pass --allow-pickle to carry the pickled bytes as they are; "
                                   "shardpack never unpickles them")
        if fmt in CARRIED:
            return Leaf(name, field_name(name, CARRIED[fmt]), fmt, "carried")
        if kind in MEDIA:
            ext = arg.lower() if re.fullmatch(r"[A-Za-z0-9]{1,10}", arg) else MEDIA[kind]
            return Leaf(name, field_name(name, "jpg" if ext == "jpeg" else ext), fmt, "carried")
        if fmt in SCALARS:
            return Leaf(name, name, fmt, "scalar", SCALARS[fmt])
        if fmt in ("pil", "json"):
            return Leaf(name, field_name(name, "png" if fmt == "pil" else "json"), fmt, fmt)
        if fmt in ("numpy", "tensor"):
            return Leaf(name, field_name(name, "npy"), fmt, fmt)
        if kind in ("no_header_numpy", "no_header_tensor"):
            table = NUMPY if kind == "no_header_numpy" else TORCH
            number = int(arg) if arg.isdigit() else -1
            dtype = (table[number] if 0 <= number < len(table) else None) \
                if kind == "no_header_numpy" else TORCH.get(number)
            if dtype is None:
                raise SourceError(f"key {name!r}: {fmt!r} has a dtype with no array form",
                                  path=shown)
            return Leaf(name, field_name(name, "npy"), fmt, kind[10:], dtype)
        raise SourceError(f"key {name!r}: unsupported LitData serializer {fmt!r}: expected one "
                          f"of {', '.join(KNOWN)}", path=shown)

    # -- one chunk ---------------------------------------------------------------------------
    def _chunk(self, chunk, shown: str):
        name, count, nbytes = _chunk_entry(chunk, shown)
        if not self.source_file(name):
            return
        where = self.storage.display(name)
        src, offsets, url, mtime = self._chunk_items(name, count, nbytes, where)
        if offsets[-1] != src.size and src.get(src.size - 8, src.size) == FOOTER_MAGIC:
            self.note("LitData Arrow row footers were ignored (the chunk bodies hold the same "
                      "rows)")
        elif offsets[-1] != src.size:
            raise SourceError(f"chunk items end at byte {offsets[-1]}, the chunk has "
                              f"{src.size}: corrupt", path=where)
        for i in range(count):
            item_where = f"{where}: item {i}"
            item, start, end = src, int(offsets[i]), int(offsets[i + 1])
            try:
                if self.compression and self.level == "sample":
                    item = _inflate_item(src.get(start, end), item_where)
                    start, end = 0, item.size
                fields = self._fields(item, start, end, url, mtime)
            except SourceError:
                raise
            except ValueError as exc:
                self.bad(item_where, str(exc), "corrupt")
                continue
            yield None, fields, item_where

    def _chunk_items(self, name: str, count: int, nbytes: int, where: str):
        """(the chunk's bytes (a Memory or a Window), its item offsets, and the URL and mtime
        that carried fields point into, or None and 0 when they are copied out)."""
        if self.compression and self.level == "chunk":
            data = self.storage.read_bytes(name)
            src = Memory(decompress("zstd", data, nbytes, where), where)
            del data
            return src, _offsets(src, count, where), None, 0
        size = self.storage.size(name)
        if size != nbytes:
            raise SourceError(f"chunk file is {size} bytes, index.json records {nbytes}: "
                              "truncated or replaced", path=where)
        src = Window(self.storage, name, size)
        if self.compression and self.level == "batch" and src.get(0, 8) == FRAMED_MAGIC:
            return (*_unframe(self.storage.read_bytes(name), count, where), None, 0)
        if self.compression and self.level == "batch":
            self.note("some chunks are indexed as batch-compressed but stored uncompressed (a "
                      "LitData writer quirk): read as plain chunks")
        offsets = _offsets(src, count, where)
        if self.compression and self.level == "sample":
            return src, offsets, None, 0
        return src, offsets, self.url(name), self.mtime_ns(name)

    def _fields(self, src, start: int, end: int, url, mtime) -> list[SourceField]:
        head = 4 * len(self.leaves)
        if end - start < head:
            raise ValueError(f"item is {end - start} bytes, shorter than its size header")
        sizes = [int(s) for s in np.frombuffer(src.get(start, start + head), "<u4")]
        if head + sum(sizes) != end - start:
            raise ValueError(f"leaf sizes add up to {head + sum(sizes)} bytes, the item is "
                             f"{end - start}")
        pos, fields = start + head, []
        for leaf, size in zip(self.leaves, sizes, strict=True):
            if leaf.kind == "carried" and url is not None:
                fields.append(SourceField(leaf.field, url, size, mtime, None, pos, None,
                                          ByteRanges))
            else:
                try:
                    value = _value(leaf, src.get(pos, pos + size))
                except SourceError:
                    raise
                except ValueError as exc:
                    raise ValueError(f"key {leaf.name!r} ({leaf.format}): {exc}") from None
                fields.append(inline(leaf.field, value))
            pos += size
        return fields


_CONVERTED = {"scalar": "ASCII decimal text", "pil": "PNG of the same pixels",
              "json": "JSON text", "numpy": ".npy array", "tensor": ".npy array",
              "pickle": "pickled bytes as they are, never unpickled",
              "graph:pickle": "pickled bytes as they are, never unpickled"}


def _chunk_entry(chunk, shown: str) -> tuple[str, int, int]:
    """(file name, items, bytes) of one chunk entry of index.json, checked."""
    if not isinstance(chunk, dict) or not isinstance(chunk.get("filename"), str) \
            or not isinstance(chunk.get("chunk_size"), int) \
            or not isinstance(chunk.get("chunk_bytes"), int):
        raise SourceError(f"bad chunk entry {chunk!r}: expected filename, chunk_size, "
                          "chunk_bytes", path=shown)
    name = chunk["filename"]
    why = unsafe_name_reason(name)
    if why:
        raise SourceError(f"chunk filename {name!r}: {why}", path=shown)
    return name, chunk["chunk_size"], chunk["chunk_bytes"]


def _leaf_names(spec_text, count: int, shown: str) -> list[str]:
    """Leaf names from the pytree spec: a flat dict's keys, a tuple/list's indexes, or
    ``data`` for a sample that is one leaf.  The spec is checked shape by shape (a JSON text
    ``[1, {"type": ..., "context": ..., "children_spec": [...]}]``; a dict's context is the JSON
    text of its key list); anything else is a one-line SourceError naming index.json."""
    def bad(why: str):
        return SourceError(f"config.data_spec is not a pytree spec: {why}", path=shown)

    root = _spec_root(spec_text, shown, bad)
    kind, children = root["type"], root["children_spec"]
    if kind is None:
        names = ["data"]
    elif kind in ("builtins.dict", "collections.OrderedDict"):
        names = _dict_keys(root.get("context"), bad)
        if len(names) != len(children):
            raise bad(f"the dict has {len(names)} keys and {len(children)} children")
    elif kind in ("builtins.tuple", "builtins.list", "collections.namedtuple"):
        names = [str(i) for i in range(len(children))]
    else:
        raise SourceError(f"unsupported sample type {kind[:80]!r} in data_spec: expected a "
                          "dict, tuple or list of values", path=shown)
    if kind is not None and any(c.get("type") is not None for c in children):
        raise SourceError("nested samples (a dict or list inside the sample) are not "
                          "supported: make each value a leaf", path=shown)
    if len(names) != count:
        raise SourceError(f"data_spec has {len(names)} leaves, data_format {count}", path=shown)
    return names


def _spec_root(spec_text, shown: str, bad) -> dict:
    """The root spec of a data_spec text, its type a name or null and its children specs."""
    if not isinstance(spec_text, str):
        raise bad(f"expected the JSON text of a spec, found a {type(spec_text).__name__}")
    spec = _json(spec_text, bad)
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], dict)):
        raise bad("expected [protocol, {type, context, children_spec}]")
    protocol, root = spec
    if protocol != 1 or isinstance(protocol, bool):
        raise SourceError(f"unsupported data_spec protocol: expected 1, found {protocol!r}",
                          path=shown)
    kind, children = root.get("type"), root.get("children_spec")
    if "type" not in root or "children_spec" not in root:
        raise bad("the root spec needs 'type' and 'children_spec'")
    if kind is not None and not isinstance(kind, str):
        raise bad(f"the sample type must be a name or null, found {kind!r}")
    if not isinstance(children, list) or not all(isinstance(c, dict) for c in children):
        raise bad("children_spec is not a list of specs")
    return root


def _dict_keys(context, bad) -> list[str]:
    """A dict sample's keys: its context is the JSON text of its key list."""
    keys = _json(context, bad) if isinstance(context, str) else None
    if not isinstance(keys, list) or not all(
            isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys):
        found = "none" if context is None else repr(str(context)[:80])
        raise bad(f"a dict's context must be the JSON text of its key list, found {found}")
    return [str(k) for k in keys]


def _json(text: str, bad):
    try:
        return json.loads(text)
    except RecursionError:
        raise bad("nested too deeply") from None
    except ValueError as exc:
        raise bad(f"not JSON: {exc}") from None


def _offsets(src, count: int, where: str) -> np.ndarray:
    """The item offsets of a classic chunk, checked against the index and the chunk size."""
    n = int(np.frombuffer(src.get(0, 4), "<u4")[0])
    if n != count:
        raise SourceError(f"chunk holds {n} items, index.json says {count}: corrupt", path=where)
    offsets = np.frombuffer(src.get(4, 8 + 4 * n), "<u4").astype(np.int64)
    if offsets[0] != 8 + 4 * n or np.any(np.diff(offsets) < 0) or offsets[-1] > src.size:
        raise SourceError("corrupt chunk: its item offsets are out of order or run past the "
                          "end", path=where)
    if n and offsets[-1] == offsets[0]:
        raise SourceError("the rows are stored only as an Arrow IPC footer (LitData's table "
                          "layout): not supported", path=where)
    return offsets


def _unframe(data: bytes, count: int, where: str) -> tuple[Memory, np.ndarray]:
    """A framed chunk's items, concatenated, and the items' offsets in them.  The frame table
    must account for every item and byte before anything is decompressed; each frame is then
    decompressed to exactly the size the table records."""
    try:
        _, version, _, n, _, nframes = _PREFIX.unpack_from(data, 0)
        if version != 1:
            raise SourceError(f"unsupported framed chunk version: expected 1, found {version}",
                              path=where)
        if n != count:
            raise SourceError(f"chunk holds {n} items, index.json says {count}: corrupt",
                              path=where)
        offsets = np.frombuffer(data, "<u4", n + 1, _PREFIX.size).astype(np.int64)
        table = _PREFIX.size + 4 * (n + 1)
        frames = [_FRAME.unpack_from(data, table + f * _FRAME.size) for f in range(nframes)]
    except SourceError:
        raise
    except (struct.error, ValueError) as exc:
        raise SourceError(f"truncated framed chunk: {exc}", path=where) from None
    firsts = np.cumsum([0] + [k for _, k, _, _, _ in frames])
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or firsts[-1] != n \
            or any(first != firsts[f] or off + clen > len(data)
                   for f, (first, _, off, clen, _) in enumerate(frames)) \
            or sum(ulen for *_, ulen in frames) != offsets[-1]:
        raise SourceError("corrupt framed chunk: its frame table and item offsets disagree",
                          path=where)
    check_expansion(int(offsets[-1]), len(data), where, "the frame table")
    parts = [decompress("zstd", data[off:off + clen], ulen, f"{where} frame {f}")
             for f, (_, _, off, clen, ulen) in enumerate(frames)]
    return Memory(b"".join(parts), where), offsets


def _inflate_item(data: bytes, where: str) -> Memory:
    """One item of a sample-level compressed chunk: a zstd frame whose header declares its
    decompressed size (the bound); an item stored plainly is taken as it is."""
    if not data.startswith(ZSTD_MAGIC):
        return Memory(data, where)
    size = zstd_frame_size(data)
    if size is None or size >= 1 << 32:
        raise ValueError("compressed item does not declare a usable decompressed size")
    return Memory(decompress("zstd", data, size, where), where)


def _value(leaf: Leaf, data: bytes) -> bytes:
    if leaf.kind == "carried":
        return data
    if leaf.kind == "scalar":
        if len(data) != np.dtype(leaf.dtype).itemsize:
            raise ValueError(f"{len(data)} bytes for a {leaf.format}")
        return decimal(data, leaf.dtype)
    if leaf.kind == "pil":
        return pil_to_png(data)
    if leaf.kind == "json":
        return to_json(data)
    if leaf.dtype is not None:  # header-less 1-D array
        return npy(leaf.dtype, (len(data) // np.dtype(leaf.dtype).itemsize,), data)
    if len(data) < 8:
        raise ValueError(f"{len(data)} bytes, shorter than an array header")
    if leaf.kind == "numpy":  # uint32 dtype number, uint32 ndim, uint32 dims, values
        code, ndim = (int(x) for x in np.frombuffer(data[:8], "<u4"))
        dtype = NUMPY[code] if code < len(NUMPY) else None
        shape_end = 8 + 4 * ndim
        shape = tuple(int(d) for d in np.frombuffer(data[8:shape_end], "<u4"))
    else:  # tensor: big-endian uint32 dtype number and rank, big-endian dims, values
        code, ndim = struct.unpack_from(">II", data)
        dtype = TORCH.get(code)
        shape_end = 8 + 4 * ndim
        shape = tuple(struct.unpack_from(f">{ndim}I", data, 8)) if len(data) >= shape_end \
            else ()
    if dtype is None or len(data) < shape_end or len(shape) != ndim:
        raise ValueError("array header is truncated or names a dtype with no array form")
    return npy(dtype, shape, data[shape_end:])
