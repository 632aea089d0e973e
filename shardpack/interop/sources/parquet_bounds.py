"""Bounds on what a Parquet file may decode to (docs/convert.md, "Parquet", "Expansion"), and
the cells of decoded binary arrays.

A Parquet file can claim more than it holds: column chunk metadata states uncompressed sizes
the pages must decompress to, and a dictionary-encoded column repeats one stored value in as
many rows as it likes (one 1 MiB value referenced by 20,000 rows is 20 GB of cells from a file of
a few KB).  Before any row of a file is read, :func:`check_claims` refuses metadata that claims
more than the decompression cap of the other converters (``common.MAX_EXPANSION`` times the
compressed bytes, or ``common.EXPANSION_FLOOR``), and :class:`Expansion` sums what the file's
cells decode to and refuses a file whose cells would exceed the same cap, naming the row group
and column where the sum crossed it.  Dictionary-encoded chunks are measured exactly without
being expanded: read with their dictionary kept, one row group at a time, the cell lengths are
the dictionary's lengths taken by the indices."""

from __future__ import annotations

from shardpack.core.errors import SourceError
from shardpack.interop.sources.common import EXPANSION_FLOOR, MAX_EXPANSION

def cap_for(compressed: int) -> int:
    """The most bytes ``compressed`` stored bytes may decode to."""
    return max(EXPANSION_FLOOR, MAX_EXPANSION * max(0, compressed))


_HINT = ("the file is damaged or crafted; if its data is real, split it into smaller files "
         "(each is allowed its own cap)")


def _limit_words() -> str:
    return f"at most {MAX_EXPANSION}x the compressed size or {EXPANSION_FLOOR >> 20} MiB"


def check_claims(meta, shown: str) -> None:
    """Refuse a row group or column chunk whose metadata claims a negative size, or more
    uncompressed bytes than the cap for its compressed bytes, before anything is decompressed."""
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        stored = 0
        for i in range(group.num_columns):
            chunk = group.column(i)
            size, packed = chunk.total_uncompressed_size, chunk.total_compressed_size
            if size < 0 or packed < 0 or size > cap_for(packed):
                raise SourceError(f"row group {g} column {chunk.path_in_schema!r} claims {size} "
                                  f"uncompressed bytes for {packed} compressed: refused "
                                  f"({_limit_words()})", path=shown,
                                  hint=_HINT)
            stored += packed
        if group.total_byte_size < 0 or group.total_byte_size > cap_for(stored):
            raise SourceError(f"row group {g} claims {group.total_byte_size} bytes for {stored} "
                              f"compressed: refused ({_limit_words()})", path=shown,
                              hint=_HINT)


class Expansion:
    """What one file's cells decode to, summed column chunk by column chunk against the cap for
    the file's compressed bytes (all its column chunks)."""

    def __init__(self, meta, shown: str):
        self.shown = shown
        self.stored = sum(meta.row_group(g).column(i).total_compressed_size
                          for g in range(meta.num_row_groups)
                          for i in range(meta.num_columns))
        self.cap = cap_for(self.stored)
        self.total = 0

    def add(self, size: int, group: int, column: str) -> None:
        """Count ``size`` decoded bytes of ``column`` in row group ``group``; refuse the file
        when the sum passes the cap."""
        self.total += size
        if self.total > self.cap:
            raise SourceError(
                f"row group {group} column {column!r}: the cells decode to more than "
                f"{self.cap} bytes, from {self.stored} bytes of column chunks (repeated "
                f"dictionary values or highly compressible data): refused ({_limit_words()} "
                f"per file)", path=self.shown,
                hint=_HINT)


def read_leaves(meta, columns) -> dict[str, str]:
    """``{leaf path: top-level column}`` of every Parquet leaf of ``columns`` (the top-level
    columns read), in schema order."""
    out = {}
    tops = sorted(columns, key=len, reverse=True)  # 'a.b' before 'a' (names may hold dots)
    for i in range(meta.num_columns):
        path = meta.schema.column(i).path
        top = next((c for c in tops if path == c or path.startswith(c + ".")), None)
        if top is not None:
            out[path] = top
    return out


def dictionary_chunks(meta, leaves: dict[str, str]) -> dict[str, list[int]]:
    """``{leaf path: [row groups]}`` of the byte-array column chunks among ``leaves`` (leaf path
    -> top-level column) that have a dictionary page: those whose cells may decode to more than
    the chunk's uncompressed size."""
    index = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    out: dict[str, list[int]] = {}
    for path in leaves:
        i = index.get(path)
        if i is None or meta.schema.column(i).physical_type != "BYTE_ARRAY":
            continue
        groups = [g for g in range(meta.num_row_groups)
                  if meta.row_group(g).column(i).has_dictionary_page]
        if groups:
            out[path] = groups
    return out


def measure(pf_dict, meta, leaves: dict[str, str], expansion: Expansion,
            reader_error) -> dict[str, dict[int, list]]:
    """Count every column chunk of ``leaves`` against ``expansion`` before any row is read, and
    return ``{leaf path: {row group: per-row cell lengths (None for a null)}}`` of the
    dictionary chunks among ``leaves`` (leaf path -> top-level column) that had to be measured
    and hold one value per row (``pf_dict`` reads every dictionary leaf with its dictionary
    kept).

    A chunk without a dictionary page counts as its uncompressed size.  A dictionary chunk
    counts as its worst case, values x its uncompressed bytes (every value the largest), while
    the sum stays within the cap; only a chunk whose worst case would pass it is measured, so
    files that could not reach the cap (the usual ones: row groups of a few hundred images) are
    never read here.  ``reader_error(exc)`` turns a pyarrow error into a SourceError."""
    risky = dictionary_chunks(meta, leaves)
    later = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for i in range(meta.num_columns):
            chunk, path = group.column(i), meta.schema.column(i).path
            if path not in leaves:  # a column not converted (``__`` columns) decodes nothing
                continue
            if g in risky.get(path, ()):
                values = max(group.num_rows, chunk.num_values)
                later.append((g, path, values * chunk.total_uncompressed_size))
            else:
                expansion.add(chunk.total_uncompressed_size, g, path)
    measured: dict[str, dict[int, list]] = {}
    read = False
    for g, path, worst in later:
        if expansion.total + worst <= expansion.cap:
            expansion.add(worst, g, path)
            continue
        read = True
        total, sizes = _chunk_lengths(pf_dict, g, leaves, path, reader_error)
        expansion.add(total, g, path)
        if sizes is not None:
            measured.setdefault(path, {})[g] = sizes
    if read:  # the dictionaries read here are not kept (the allocator would keep them)
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    return measured


def _chunk_lengths(pf_dict, group: int, leaves: dict[str, str], path: str,
                   reader_error) -> tuple[int, list | None]:
    """(bytes, per-row lengths or None) of leaf ``path``'s cells in row group ``group``: its
    top-level column read with every dictionary kept, so memory holds dictionaries and indices,
    never repeated values.  Per-row lengths only for a leaf with one value per row (a plain
    column, a struct field); a leaf inside lists gives its total."""
    import pyarrow as pa

    column = leaves[path]
    k = [p for p, top in leaves.items() if top == column].index(path)
    try:
        table = pf_dict.read_row_group(group, columns=[column], use_threads=False)
    except (pa.ArrowException, OSError, ValueError, MemoryError) as exc:
        raise reader_error(exc) from None
    sizes, per_row = [], True
    for chunk in table.column(0).chunks:
        leaf, aligned = list(_leaf_arrays(chunk, True))[k]
        sizes += lengths(leaf)
        per_row = per_row and aligned
    return sum(s for s in sizes if s is not None), (sizes if per_row else None)


def _leaf_arrays(array, aligned: bool):
    """``(array, one value per row)`` of each leaf of an Arrow array, in Parquet's leaf order
    (struct fields in order, list elements flattened, map keys then values)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = array.type
    if pa.types.is_struct(t):
        for j in range(t.num_fields):
            yield from _leaf_arrays(pc.struct_field(array, [j]), aligned)
    elif pa.types.is_map(t):
        yield from _leaf_arrays(array.keys, False)
        yield from _leaf_arrays(array.items, False)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        yield from _leaf_arrays(array.flatten(), False)
    else:
        yield array, aligned


def distinct_values(array) -> list:
    """The distinct non-null values of an Arrow array (a dictionary array's referenced
    values, each made once), as Python objects."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(array.type):
        array = array.dictionary.take(pc.unique(array.indices.drop_null()))
    return [v for v in pc.unique(array).to_pylist() if v is not None]


def lengths(array) -> list:
    """The byte length of each cell of a binary Arrow array (None for a null); a dictionary
    array's without decoding it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(array.type):
        return pc.binary_length(array.dictionary).take(array.indices).to_pylist()
    return pc.binary_length(array).to_pylist()


def index_in(array, names):
    """The index of each cell of a string Arrow array among ``names`` (a string array); a
    dictionary array's looked up once per dictionary value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(array.type):
        return pc.index_in(array.dictionary,
                           value_set=names.cast(array.type.value_type)).take(array.indices)
    return pc.index_in(array, value_set=names.cast(array.type))


def struct_field(array, parts: tuple):
    """The struct field ``parts`` (a path of names) of an Arrow array."""
    import pyarrow.compute as pc

    for part in parts:
        array = pc.struct_field(array, part)
    return array


class Cells:
    """The cells of an Arrow binary array without a copy each: slices of its data buffer;
    ``rows`` maps a row to its entry (the indices of a dictionary array)."""

    def __init__(self, offsets, data: memoryview, rows=None):
        self.offsets, self.data, self.rows = offsets, data, rows

    def __getitem__(self, i: int) -> memoryview:
        if self.rows is not None:
            i = int(self.rows[i])
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])]


def cells(array):
    """Indexable cells of a binary Arrow array: zero-copy for plain binary without nulls and
    for a dictionary array without nulls (each row a slice of its stored value); otherwise a
    list of bytes or None, a dictionary's values made once and shared by the rows that repeat
    them.  A repeated value is never copied out once per row."""
    import numpy as np
    import pyarrow as pa

    t = array.type
    rows = None
    if pa.types.is_dictionary(t):
        if array.null_count or array.dictionary.null_count:
            values = array.dictionary.to_pylist()
            return [None if r is None else values[r] for r in array.indices.to_pylist()]
        rows = array.indices.to_numpy(zero_copy_only=False)
        array, t = array.dictionary, t.value_type
    if array.null_count == 0 and (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        width = 8 if pa.types.is_large_binary(t) else 4
        _, offsets, data = array.buffers()
        offsets = np.frombuffer(offsets, dtype=f"<i{width}", count=len(array) + 1,
                                offset=array.offset * width)
        return Cells(offsets, memoryview(data) if data is not None else memoryview(b""), rows)
    values = array.to_pylist()
    return values if rows is None else [values[r] for r in rows]
