"""The on-disk format as code: byte layouts, encoders and decoders, and nothing that does I/O.

Everything here takes and returns bytes.  ``docs/format.md`` mirrors these layouts as byte tables;
change both together and bump :data:`FORMAT_VERSION` when a reader of the old version would
misread the new bytes.  All integers are little-endian.

A dataset is a folder (or URL prefix) holding

* ``shard-NNNNN.tar`` or ``shard-NNNNN.spk`` - the samples, one shard file per plan task;
* ``shard-NNNNN.idx`` - that shard's binary index (offsets, sizes, hashes and keys of its samples);
* ``shardpack.json`` - the manifest, written last: it is the commit point of a pack.

This package's modules, by concern: :mod:`.names` (file names, versions, key and field-name
rules), :mod:`.hashing`, :mod:`.tar` (ustar/pax), :mod:`.records` (msgpack records),
:mod:`.shardcodec` (what a shard format is), :mod:`.tarcodec` and :mod:`.msgpackcodec` (the two
formats), :mod:`.codecs` (the registry, :func:`codec_for`), :mod:`.index`, :mod:`.manifest` and
:mod:`.manifest_checks`.  Callers use this package's names: ``from shardpack import format as
fmt; fmt.decode_index(...)``; every shard-format decision goes through a codec
(``fmt.codec_for(manifest.shard_format)``, ``index.codec``).
"""

from shardpack.core.errors import FormatError, IntegrityError, VersionError

from .codecs import (
    CODECS, FORMAT_CODES, SHARD_FORMATS, SHARD_SUFFIX, SHARD_SUFFIXES, codec_by_code, codec_for,
    shard_name,
)
from .hashing import (
    content_hash, crc32c, crc32c_function, new_content_hasher, sample_hash, sample_hashes,
)
from .index import (
    COMPRESSION_CODES, INDEX_HEADER, INDEX_MAGIC, INDEX_TRAILER, INDEX_WIDE, MAX_INDEX_FIELDS,
    MIN_INDEX_BYTES, MISSING, FieldSpans, ShardIndex, decode_index, encode_index,
)
from .manifest import (
    MANIFEST_CAP, Manifest, Part, ShardEntry, decode_manifest, encode_manifest, thaw,
)
from .manifest_checks import (
    CONVERTED_LAYOUTS, MAX_COUNT, PACK_LAYOUTS, SHARD_KEYS, check_manifest, is_count, is_int,
    parse_manifest,
)
from .msgpackcodec import MsgpackCodec
from .names import (
    COMPRESSIONS, FORMAT_VERSION, HASH_NAME, INDEX_SUFFIX, KEY_FIELD, MANIFEST_FORMAT,
    MANIFEST_NAME, READ_VERSIONS, SKIPS_NAME, STATE_NAME, check_field_name, index_name,
    reserved_field_reason, shard_stem, shown_name, split_name, unsafe_name_reason,
)
from .records import (
    FLAG_ZSTD, MAX_EXPANSION, MSGPACK_HEADER, MSGPACK_MAGIC, RECORD_HEADER, RECORD_HEADER_DTYPE,
    check_msgpack_file_header, decode_payload, encode_payload, msgpack_file_header,
    record_header,
)
from .shardcodec import ShardCodec
from .tar import (
    OCTAL_SIZE_LIMIT, PAX_NAME, TAR_BLOCK, TAR_END, TAR_MODE, TAR_MTIME, TarMember, parse_pax,
    parse_tar_header, parse_tar_member, tar_header, tar_member_name, tar_padding,
    unescape_key_part, ustar_block,
)
from .tarcodec import TarCodec

__all__ = [
    # errors the decoders raise
    "FormatError", "IntegrityError", "VersionError",
    # names, versions, key and field-name rules
    "COMPRESSIONS", "FORMAT_VERSION", "HASH_NAME", "INDEX_SUFFIX", "KEY_FIELD", "MANIFEST_FORMAT",
    "MANIFEST_NAME", "READ_VERSIONS", "SKIPS_NAME", "STATE_NAME", "check_field_name",
    "index_name", "reserved_field_reason", "shard_stem", "shown_name", "split_name",
    "unsafe_name_reason",
    # shard formats
    "CODECS", "FORMAT_CODES", "SHARD_FORMATS", "SHARD_SUFFIX", "SHARD_SUFFIXES", "MsgpackCodec",
    "ShardCodec", "TarCodec", "codec_by_code", "codec_for", "shard_name",
    # checksums
    "content_hash", "crc32c", "crc32c_function", "new_content_hasher", "sample_hash",
    "sample_hashes",
    # tar
    "OCTAL_SIZE_LIMIT", "PAX_NAME", "TAR_BLOCK", "TAR_END", "TAR_MODE", "TAR_MTIME", "TarMember",
    "parse_pax", "parse_tar_header", "parse_tar_member", "tar_header", "tar_member_name",
    "tar_padding", "unescape_key_part", "ustar_block",
    # msgpack records
    "FLAG_ZSTD", "MAX_EXPANSION", "MSGPACK_HEADER", "MSGPACK_MAGIC", "RECORD_HEADER",
    "RECORD_HEADER_DTYPE", "check_msgpack_file_header", "decode_payload", "encode_payload",
    "msgpack_file_header", "record_header",
    # index
    "COMPRESSION_CODES", "INDEX_HEADER", "INDEX_MAGIC", "INDEX_TRAILER", "INDEX_WIDE",
    "MAX_INDEX_FIELDS", "MIN_INDEX_BYTES", "MISSING", "FieldSpans", "ShardIndex", "decode_index",
    "encode_index",
    # manifest
    "CONVERTED_LAYOUTS", "MANIFEST_CAP", "MAX_COUNT", "PACK_LAYOUTS", "SHARD_KEYS", "Manifest",
    "Part", "ShardEntry", "check_manifest", "decode_manifest", "encode_manifest", "is_count",
    "is_int", "parse_manifest", "thaw",
]
