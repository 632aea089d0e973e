"""Hostile conversion inputs (tests/robustness/hostile/sources/, written by
tests/robustness/hostile/make_sources.py):
each gets exit status 2 and one stderr line naming the file, within a time limit (a parser that
does not advance fails the test instead of hanging CI) and, through the Python API, under an
address-space limit of 1 GiB above the interpreter's own (a parser that allocates what a header
claims fails with MemoryError).  Then bounded fuzzing of the tar header parser and of the
decoders of LitData json and raw PIL cells."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardpack import format as fmt
from shardpack.interop.convert import convert
from shardpack.core.errors import FormatError, SourceError
from shardpack.interop.sources import common
from shardpack.interop.sources.litdata_json import to_json

from testbed.helpers import run_subprocess

SOURCES = Path(__file__).resolve().parent / "hostile" / "sources"

# case (file or folder under SOURCES) -> (the file the error names, words the line holds)
CASES = {
    "tar_pax_negative_size.tar": ("", "member 2 (after 'a.txt')", "byte 1024",
                                  "pax size b'-1536' is not a non-negative decimal integer"),
    "tar_pax_size_not_a_number.tar": ("", "member 2", "pax size b'abc'"),
    "tar_pax_record_too_long.tar": ("", "member 2", "bad pax record length b'99'"),
    "tar_pax_record_without_equals.tar": ("", "member 2", "bad pax record", "KEYWORD=VALUE"),
    "tar_negative_octal_size.tar": ("", "member 2", "byte 1024", "size is negative"),
    "tar_pax_header_negative_octal_size.tar": ("", "member 2", "size is negative"),
    "tar_non_utf8_name.tar": ("", r"member b'k\xff\xfe.txt'", "not valid UTF-8", "--skip-bad"),
    "tgz_pax_negative_size.tar.gz": ("", "member 2 (after 'a.txt')", "size '-1536'",
                                     "not a non-negative integer"),
    "tgz_pax_size_not_a_number.tar.gz": ("", "member 2", "size 'abc'"),
    "tgz_negative_octal_size.tar.gz": ("", "member 2", "size -512"),
    "tgz_non_utf8_name.tar.gz": ("", r"member b'k\xff\xfe.txt'", "not valid UTF-8"),
    "mds_zstd_index_claims_1gib": ("shard.00000.mds.zstd", "records 1073741824",
                                   "zstd frame header says 21"),
    "mds_zstd_frame_claims_1gib": ("shard.00000.mds.zstd", "1073741824 decompressed bytes for 17 "
                                   "compressed", "at most 1024x"),
    "mds_pil_40000x40000": ("shard.00000.mds", "sample 0", "column 'image' (pil)",
                            "40000x40000 needs 1600000000 bytes", "holds 0"),
    "litdata_pil_40000x40000": ("chunk-0-0.bin", "item 0", "40000x40000 needs 4800000000 bytes",
                                "holds 1"),
    "litdata_spec_not_json": ("index.json", "data_spec is not a pytree spec", "not JSON"),
    "litdata_spec_not_a_string": ("index.json", "expected the JSON text of a spec"),
    "litdata_spec_not_a_pair": ("index.json", "expected [protocol,"),
    "litdata_spec_root_not_object": ("index.json", "expected [protocol,"),
    "litdata_spec_no_context": ("index.json", "context must be the JSON text of its key list"),
    "litdata_spec_context_not_json": ("index.json", "not JSON"),
    "litdata_spec_context_not_list": ("index.json", "key list, found '5'"),
    "litdata_spec_children_not_list": ("index.json", "children_spec is not a list"),
    "litdata_spec_type_not_string": ("index.json", "sample type must be a name or null"),
    "litdata_spec_protocol_2": ("index.json", "protocol: expected 1, found 2"),
    "litdata_spec_deeply_nested": ("index.json", "nested too deeply"),
    "litdata_json_records_without_keys": ("chunk-0-0.bin", "item 0", "key 'meta' (json)",
                                          "4294967295 rows and 0 keys run past the end"),
    "litdata_json_nested_tags": ("chunk-0-0.bin", "item 0", "nested more than 200 deep"),
    "litdata_json_nested_text": ("chunk-0-0.bin", "item 0", "nested too deeply"),
}


def test_the_corpus_is_complete_and_small():
    assert sorted(p.name for p in SOURCES.iterdir()) == sorted(CASES)
    for path in SOURCES.rglob("*"):
        assert path.is_dir() or path.stat().st_size <= 12_000, path


def _named(case: str) -> str:
    """The path the error line must name."""
    return str(SOURCES / case / CASES[case][0]).rstrip("/")


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_one_line_exit_2(case, tmp_path):
    try:
        result = run_subprocess("convert", SOURCES / case, tmp_path / "out", "--workers", "1",
                                timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"convert of {case} did not finish in 30 s (a parser that does not advance?)")
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    line = lines[0]
    assert line.startswith(f"shardpack: error: {_named(case)}"), line
    for words in CASES[case][1:]:
        assert words in line, (words, line)
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()


API_RUN = textwrap.dedent("""
    import json, resource, sys, tempfile, traceback
    import numpy, PIL.Image, PIL.PngImagePlugin, zstandard  # noqa: F401 - before the limit
    import shardpack.interop.sources.litdata, shardpack.interop.sources.mds  # noqa: F401
    import shardpack.interop.sources.webdataset  # noqa: F401
    from shardpack.interop.convert import convert
    from shardpack.core.errors import ShardpackError

    def vm():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

    limit = vm() + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    results = {}
    for case in json.loads(sys.argv[2]):
        with tempfile.TemporaryDirectory() as out:
            try:
                convert(f"{sys.argv[1]}/{case}", f"{out}/o", workers=1, progress=False)
                results[case] = ["ok", ""]
            except ShardpackError as exc:
                results[case] = [type(exc).__name__, str(exc)]
            except BaseException as exc:  # MemoryError, RecursionError, ...
                results[case] = [type(exc).__name__, traceback.format_exc()[-2000:]]
    print(json.dumps(results))
""")


def test_python_api_under_a_memory_limit():
    """All cases in one process whose address space is limited to 1 GiB above its start:
    each must end in a ShardpackError, never MemoryError or another exception."""
    try:
        result = subprocess.run([sys.executable, "-c", API_RUN, str(SOURCES),
                                 json.dumps(sorted(CASES))],
                                capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the API run did not finish in 60 s (a parser that does not advance?)")
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.splitlines()[-1])
    for case, (kind, text) in results.items():
        assert kind in ("SourceError", "FormatError"), (case, kind, text)
        assert "\n" not in text and text.startswith(_named(case)), (case, text)
        for words in CASES[case][1:]:
            words = PYTHON_SPELLING.get(words, words)  # Python errors name keywords
            assert words in text, (case, words, text)


PYTHON_SPELLING = {"--skip-bad": 'on_error="skip"'}


@pytest.mark.parametrize("name", ["tar_non_utf8_name.tar", "tgz_non_utf8_name.tar.gz"])
def test_non_utf8_member_names_are_skipped_and_counted(name, tmp_path):
    summary = convert(SOURCES / name, tmp_path / "out", workers=1, on_error="skip")
    assert summary.samples == 1 and summary.skipped == {"bad-name": 1}


# -- decompression bounds -----------------------------------------------------------------------
def test_decompression_stops_at_the_recorded_size_without_a_frame_size():
    import zstandard

    raw = bytes(range(256)) * 40
    data = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    assert common.zstd_content_size(data) is None
    with pytest.raises(SourceError, match=r"x\.zst: decompresses to more than the 10000 bytes"):
        common.decompress("zstd", data, 10_000, "x.zst")
    with pytest.raises(SourceError, match=r"decompresses to 10240 bytes, the index records 20000"):
        common.decompress("zstd", data, 20_000, "x.zst")
    assert bytes(common.decompress("zstd", data, len(raw), "x.zst")) == raw


def test_frame_sizes_are_summed_over_frames_and_checked_before_decompressing():
    import zstandard

    one = zstandard.ZstdCompressor().compress(b"a" * 5000)
    skippable = (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"xyz"
    two = one + skippable + zstandard.ZstdCompressor(write_checksum=True).compress(b"b" * 700)
    assert common.zstd_content_size(two) == 5700
    assert common.zstd_content_size(two[:-1]) is None  # does not walk to the end
    assert bytes(common.decompress("zstd", two, 5700, "x")) == b"a" * 5000 + b"b" * 700
    with pytest.raises(SourceError, match="records 5000 decompressed bytes, the zstd frame "
                                          "header says 5700"):
        common.decompress("zstd", two, 5000, "x")


def test_expansion_cap():
    common.check_expansion(common.EXPANSION_FLOOR, 1, "x")
    common.check_expansion(common.MAX_EXPANSION * (1 << 20), 1 << 20, "x")
    for expected, compressed in ((common.EXPANSION_FLOOR + 1, 1), (-1, 10),
                                 (common.MAX_EXPANSION * (1 << 20) + 1, 1 << 20)):
        with pytest.raises(SourceError, match=r"^x: the index records -?\d+ decompressed bytes "
                                              r"for \d+ compressed: refused"):
            common.check_expansion(expected, compressed, "x")
    gz = __import__("gzip").compress(bytes(1 << 20), mtime=0)  # ~1 KB: a 1 MiB claim is fine
    assert len(common.decompress("gz", gz, 1 << 20, "x")) == 1 << 20


# -- fuzzing ------------------------------------------------------------------------------------
def _valid_tars() -> list[tuple[bytes, list[int]]]:
    """Valid archives of one member, and the offsets of their header blocks."""
    out = []
    for name, size in (("a.jpg", 3), ("x" * 150 + ".png", 600), ("ünï.txt", 0),
                       ("big.bin", fmt.OCTAL_SIZE_LIMIT)):
        head = fmt.tar_header(name, size)
        data = bytes(min(size, 700))
        blob = head + data + bytes(fmt.tar_padding(len(data))) + fmt.TAR_END
        out.append((blob, list(range(0, len(head), fmt.TAR_BLOCK))))
    for kind in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):  # GNU long names, pax by tarfile
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=kind) as tf:
            info = tarfile.TarInfo("d/" + "n" * 120 + ".cls")
            info.size = 2
            tf.addfile(info, io.BytesIO(b"42"))
        blob = buf.getvalue()
        heads = [0]
        while True:  # headers before the member's own: each is followed by its data
            size = int(blob[heads[-1] + 124:heads[-1] + 135].strip(b"\0 ") or b"0", 8)
            if blob[heads[-1] + 156:heads[-1] + 157] not in (b"x", b"L", b"g"):
                break
            heads.append(heads[-1] + fmt.TAR_BLOCK + size + fmt.tar_padding(size))
        out.append((blob, heads))
    return out


VALID = _valid_tars()


def _reseal(blob: bytearray, at: int) -> None:
    block = blob[at:at + fmt.TAR_BLOCK]
    if len(block) == fmt.TAR_BLOCK:
        blob[at + 148:at + 156] = b"%06o\0 " % (sum(block) - sum(block[148:156]) + 8 * 32)


def _check_scan(buf: bytes) -> None:
    """Parse like the WebDataset scan does: only FormatError, and every member advances."""
    pos, steps = 0, 0
    while pos + fmt.TAR_BLOCK <= len(buf):
        steps += 1
        assert steps <= len(buf) // fmt.TAR_BLOCK
        try:
            m = fmt.parse_tar_header(buf, pos)
        except FormatError:
            return
        assert m.size >= 0 and fmt.TAR_BLOCK <= m.data_offset <= m.end
        assert m.end == m.data_offset + m.size + fmt.tar_padding(m.size)
        assert m.data_offset <= len(buf) - pos
        pos += m.end


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(min_size=0, max_size=3 * fmt.TAR_BLOCK))
def test_fuzz_tar_header_arbitrary_bytes(buf):
    _check_scan(buf)
    _check_scan(buf + bytes(fmt.TAR_BLOCK))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(range(len(VALID))),
       st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1,
                max_size=8),
       st.booleans())
def test_fuzz_tar_header_mutated(which, mutations, reseal):
    blob, heads = VALID[which]
    buf = bytearray(blob)
    for where, byte in mutations:
        head = heads[where % len(heads)]
        # mostly inside a header block (or the pax / long-name data after it)
        pos = head + (where >> 4) % (2 * fmt.TAR_BLOCK) if where & 1 else where % len(buf)
        if pos < len(buf):
            buf[pos] = byte
    if reseal:  # let the mutation past the checksum, to reach the size and pax parsing
        for head in heads:
            _reseal(buf, head)
    _check_scan(bytes(buf))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.binary(max_size=64), st.builds(
    lambda tags, tail: bytes(tags) + tail,
    st.lists(st.integers(0, 12), min_size=1, max_size=6), st.binary(max_size=40))))
def test_fuzz_litdata_json_leaf(data):
    try:
        out = to_json(data)
    except ValueError:
        return
    json.loads(out)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1),
       st.sampled_from([b"1", b"L", b"RGB", b"RGBA", b"I;16", b"F", b"XYZ", b""]),
       st.binary(max_size=64))
def test_fuzz_pil_cell(width, height, mode, pixels):
    width, height = width % 9 if width & 1 else width, height % 9 if height & 1 else height
    cell = common.np.array([width, height, len(mode)], "<u4").tobytes() + mode + pixels
    try:
        png = common.pil_to_png(cell)
    except ValueError:
        return
    assert png.startswith(b"\x89PNG")


def test_compressed_tar_member_over_the_memory_cap_is_refused(tmp_path, monkeypatch):
    from shardpack.interop.sources import tarread

    src = tmp_path / "big.tar.gz"
    with tarfile.open(src, "w:gz") as tf:
        for name, size in (("a.txt", 10), ("b.bin", 5000)):
            info = tarfile.TarInfo(name)
            info.size = size
            tf.addfile(info, io.BytesIO(b"x" * size))
    monkeypatch.setattr(tarread, "MAX_INLINE_MEMBER", 4096)
    with pytest.raises(SourceError, match=r"big\.tar\.gz: tar member 'b\.bin' is 5000 bytes, "
                                          r"more than the") as exc:
        convert(src, tmp_path / "out", workers=1)
    assert "gunzip" in exc.value.hint
    monkeypatch.setattr(tarread, "MAX_INLINE_MEMBER", 5000)  # at the cap: read
    assert convert(src, tmp_path / "out2", workers=1).samples == 2
