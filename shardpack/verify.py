"""``shardpack verify``: re-hash every shard and index and check every record.

A flipped byte anywhere changes the shard's xxh3-128 (caught against the manifest) and the xxh3-64
of the sample holding it (caught against the index), so the report names the sample.  Structure is
checked too: tar headers must name ``key.field`` with the indexed size and be regular files;
msgpack records must pass CRC32C, decompress to the indexed size and unpack to the indexed fields.
``decode=True`` (``verify --decode``) also decodes every image field in full
(:func:`shardpack.images.check_image_full`), so a broken image packed with ``--check none`` (or by
an older release) is named too.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import format as fmt
from .errors import ShardpackError
from .reader import DatasetReader, record_payload


@dataclass(frozen=True)
class Problem:
    path: str
    reason: str
    key: str | None = None

    def __str__(self) -> str:
        where = f"{self.path}: sample {self.key!r}" if self.key is not None else self.path
        return f"{where}: {self.reason}"


@dataclass
class VerifyReport:
    shards: int = 0
    samples: int = 0
    bytes: int = 0
    problems: list = None

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(url, storage_options: dict | None = None, progress: bool = False,
           decode: bool = False) -> VerifyReport:
    reader = DatasetReader(url, storage_options)
    report = VerifyReport(problems=[])
    shards = range(len(reader.shards))
    if progress:
        from tqdm import tqdm

        shards = tqdm(shards, unit="shard", desc="verifying")
    for number in shards:
        report.shards += 1
        report.problems += _verify_shard(reader, number, report, decode)
    counted = sum(s["samples"] for s in reader.shards)
    if counted != reader.manifest.get("num_samples"):
        report.problems.append(Problem(reader.storage.display(fmt.MANIFEST_NAME),
                                       f"num_samples {reader.manifest.get('num_samples')} != "
                                       f"sum over shards {counted}"))
    return report


def _verify_shard(reader: DatasetReader, number: int, report: VerifyReport,
                  decode: bool = False) -> list[Problem]:
    entry = reader.shards[number]
    path = reader.shard_path(number)
    try:
        index = reader.index(number)
    except ShardpackError as exc:
        return [Problem(reader.storage.display(entry["index"]), exc.message)]
    try:
        data = reader.storage.read_bytes(entry["name"])
    except ShardpackError as exc:
        return [Problem(path, exc.message)]
    report.bytes += len(data)
    problems = []
    if len(data) != entry["bytes"]:
        problems.append(Problem(path, f"shard is {len(data)} bytes, the manifest says "
                                      f"{entry['bytes']} (truncated or extended)"))
    elif fmt.content_hash(data) != entry["hash"]:
        problems.append(Problem(path, "shard hash does not match the manifest"))
    if index.shard_format == "msgpack":
        try:
            fmt.check_msgpack_file_header(data[:fmt.MSGPACK_HEADER.size])
        except ShardpackError as exc:
            problems.append(Problem(path, exc.message))
    view = memoryview(data)
    images: list[Problem] = []  # undecodable images: reported after the structural checks
    for row in range(index.num_samples):
        report.samples += 1
        start, end = index.span(row)
        key = index.key(row)
        if end > len(data):
            problems.append(Problem(path, f"sample runs past the end of the shard ({end} > "
                                          f"{len(data)} bytes)", key))
            continue
        record = view[start:end]
        if fmt.sample_hash(record) != int(index.sample_hashes[row]):
            problems.append(Problem(path, f"bytes {start}..{end} do not match the sample's "
                                          "hash in the index", key))
            continue
        try:
            _check_structure(index, row, record, path)
        except ShardpackError as exc:
            problems.append(Problem(path, exc.message, key))
            continue
        if decode:
            images += _check_images(index, row, record, path, key)
    if index.shard_format == "tar" and not problems:
        tail = data[int(index.starts[-1]):]
        if tail != fmt.TAR_END:
            problems.append(Problem(path, "tar shard does not end with two zero blocks"))
    return problems + images


def _check_images(index: fmt.ShardIndex, row: int, record, path: str, key: str) -> list[Problem]:
    from .images import check_image_full, is_image_field

    payload = None
    out = []
    for name, off, size in index.sample_fields(row):
        if not is_image_field(name):
            continue
        if payload is None:
            payload = record_payload(index, row, record, path)
        why = check_image_full(bytes(payload[off:off + size]), name)
        if why:
            out.append(Problem(path, f"field {name!r}: {why}", key))
    return out


def _check_structure(index: fmt.ShardIndex, row: int, record, path: str) -> None:
    key = index.key(row)
    fields = index.sample_fields(row)
    payload = record_payload(index, row, record, path)
    if index.shard_format == "tar":
        pos = 0
        for name, off, size in fields:
            member = fmt.parse_tar_member(payload, pos)
            if member.name != index.member_name(key, name) or member.size != size or \
                    pos + member.data_offset != off:
                raise fmt.FormatError(f"tar member {member.name!r} ({member.size} bytes) does "
                                      f"not match the index ({index.member_name(key, name)}, "
                                      f"{size} bytes)")
            pos += member.end
        if pos != len(payload):
            raise fmt.FormatError("tar record has bytes the index does not account for")
        return
    obj = fmt.decode_payload(bytes(payload), max_fields=len(index.fields))
    if obj[fmt.KEY_FIELD] != key:
        raise fmt.FormatError(f"record key {obj[fmt.KEY_FIELD]!r} != index key")
    names = sorted(n for n in obj if n != fmt.KEY_FIELD)
    if names != [n for n, _, _ in fields]:
        raise fmt.FormatError(f"record fields {names} != index fields")
    for name, off, size in fields:
        if obj[name] != bytes(payload[off:off + size]):
            raise fmt.FormatError(f"field {name!r} does not match its indexed bytes")
