"""Drawing a preview: the contact sheet (PNG, Pillow) and the self-contained HTML page, from cells
made by :mod:`shardpack.inspect.preview`.  :class:`Layout` says where everything goes (tests
compute boxes from it).
"""

from __future__ import annotations

import base64
import functools
import html
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardpack.core.sizes import human
from shardpack.images.formats.jpeg import JPEG

if TYPE_CHECKING:
    from shardpack.inspect.preview import PreviewOptions

BORDER = 3             # a marked cell's red border, px
RED = (210, 30, 30)
PANEL = (236, 236, 236)


@dataclass(frozen=True)
class Layout:
    """Where everything goes on a sheet of ``count`` cells (tests compute boxes from it)."""
    count: int
    columns: int
    cell: int

    @property
    def font(self) -> int:
        """Font size, px."""
        return max(10, self.cell // 10)

    @property
    def line(self) -> int:
        """Height of a text line, px."""
        return self.font + 4

    @property
    def gap(self) -> int:
        """Space between cells, px."""
        return max(4, self.cell // 16)

    @property
    def text(self) -> int:
        """Height of the two text lines under each image (key, label), px."""
        return 2 * self.line + 2

    @property
    def title(self) -> int:
        """Height of the title band, px."""
        return self.line + self.gap

    @property
    def rows(self) -> int:
        """Rows of cells."""
        return max(1, math.ceil(self.count / self.columns))

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the sheet, px."""
        return (self.columns * (self.cell + self.gap) + self.gap,
                self.title + self.rows * (self.cell + self.text + self.gap) + self.gap)

    def box(self, i: int) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) of cell i's image area, right and bottom exclusive."""
        row, col = divmod(i, self.columns)
        x = self.gap + col * (self.cell + self.gap)
        y = self.title + self.gap + row * (self.cell + self.text + self.gap)
        return x, y, x + self.cell, y + self.cell


def layout(count: int, opts: PreviewOptions) -> Layout:
    """The layout of a sheet of ``count`` cells: ``opts.columns`` columns (default square-ish) of
    ``opts.cell`` px cells.

    Args:
        count: cells on the sheet.
        opts: the preview's options.
    """
    columns = opts.columns or max(1, math.ceil(math.sqrt(count)))
    return Layout(count, max(1, min(columns, max(count, 1))), opts.cell)


@dataclass
class Cell:
    """One sample on the sheet: its key and label, and its thumbnail or why there is none."""

    key: str
    label: str | None          # None: the dataset has no labels
    thumb: object | None       # a PIL image fitting the cell, or None (marked)
    error: str | None = None   # why the cell is marked
    field: str | None = None
    size: tuple | None = None  # the image's (width, height)
    nbytes: int = 0


# -- drawing --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow 10.0: one size only
        return ImageFont.load_default()


def _fit(text: str, font, width: int, keep_end: bool = False) -> str:
    """``text`` cut (with '...') to fit ``width`` px; ``keep_end`` cuts the start instead (a
    key's end tells samples apart: ``...cycle_right/001234``)."""
    if font.getlength(text) <= width:
        return text
    while text and font.getlength("..." + text if keep_end else text + "...") > width:
        text = text[1:] if keep_end else text[:-1]
    return "..." + text if keep_end else text + "..."


def _wrap(text: str, font, width: int, lines: int) -> list[str]:
    """``text`` in at most ``lines`` lines of ``width`` px (the last one cut with '...')."""
    out, current = [], ""
    for word in text.split():
        trial = f"{current} {word}".strip()
        if font.getlength(trial) <= width:
            current = trial
            continue
        if current:
            out.append(current)
        current = word
        while font.getlength(current) > width and len(current) > 1:  # a long word: break it
            cut = len(current)
            while cut > 1 and font.getlength(current[:cut]) > width:
                cut -= 1
            out.append(current[:cut])
            current = current[cut:]
    if current:
        out.append(current)
    if len(out) > lines:
        out = out[:lines - 1] + [_fit(" ".join(out[lines - 1:]), font, width)]
    return out


def draw_sheet(cells: list[Cell], opts: PreviewOptions, title: str):
    """The contact sheet, a PIL RGB image of :func:`layout`'s size."""
    from PIL import Image, ImageDraw

    lay = layout(len(cells), opts)
    sheet = Image.new("RGB", lay.size, "white")
    draw = ImageDraw.Draw(sheet)
    font, small = _font(lay.font), _font(max(9, lay.font - 2))
    draw.text((lay.gap, lay.gap // 2), _fit(title, font, lay.size[0] - 2 * lay.gap),
              fill=(40, 40, 40), font=font)
    for i, cell in enumerate(cells):
        x0, y0, x1, y1 = lay.box(i)
        draw.rectangle((x0, y0, x1 - 1, y1 - 1), fill=PANEL)
        if cell.thumb is not None:
            w, h = cell.thumb.size
            sheet.paste(cell.thumb, (x0 + (lay.cell - w) // 2, y0 + (lay.cell - h) // 2))
        else:
            draw.rectangle((x0, y0, x1 - 1, y1 - 1), outline=RED, width=BORDER)
            inner = lay.cell - 2 * BORDER - 6
            step = small.size + 2 if hasattr(small, "size") else lay.line
            for k, text in enumerate(_wrap(cell.error or "", small, inner,
                                           max(1, inner // step))):
                draw.text((x0 + BORDER + 3, y0 + BORDER + 3 + k * step), text, fill=RED,
                          font=small)
        draw.text((x0, y1 + 1), _fit(cell.key, font, lay.cell, keep_end=True), fill=(0, 0, 0),
                  font=font)
        if cell.label is not None:
            draw.text((x0, y1 + 1 + lay.line), _fit(cell.label, font, lay.cell),
                      fill=(20, 70, 150), font=font)
    return sheet


_CSS = """body{font-family:system-ui,sans-serif;margin:16px;background:#fff;color:#222}
h1{font-size:15px;font-weight:600}
.grid{display:flex;flex-wrap:wrap;gap:8px}
figure{margin:0;width:%(cell)dpx}
.img{width:%(cell)dpx;height:%(cell)dpx;background:#ececec;display:flex;align-items:center;
justify-content:center;box-sizing:border-box}
.bad .img{border:3px solid #d21e1e;color:#d21e1e;font-size:11px;padding:4px;overflow:hidden;
word-break:break-word}
figcaption{font-size:12px;line-height:1.3;overflow-wrap:anywhere}
.label{color:#14469a}.meta{color:#777;font-size:11px}"""


def html_page(cells: list[Cell], opts: PreviewOptions, title: str) -> str:
    """A self-contained page: thumbnails inline (data: URIs), keys and labels as text."""
    esc = html.escape
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{esc(title)}</title>", f"<style>{_CSS % {'cell': opts.cell}}</style>",
             f"</head><body><h1>{esc(title)}</h1>", '<div class="grid">']
    for cell in cells:
        if cell.thumb is not None:
            uri = ("data:image/jpeg;base64,"
                   + base64.b64encode(JPEG.encode(cell.thumb, quality=85)).decode("ascii"))
            w, h = cell.thumb.size
            body = (f'<div class="img"><img src="{uri}" width="{w}" height="{h}" '
                    f'alt="{esc(cell.key)}"></div>')
            meta = f"{cell.field} {cell.size[0]}x{cell.size[1]}, {human(cell.nbytes)}"
            kind = ""
        else:
            body = f'<div class="img">{esc(cell.error or "")}</div>'
            meta, kind = (cell.field or ""), ' class="bad"'
        label = f'<div class="label">{esc(cell.label)}</div>' if cell.label is not None else ""
        parts.append(f'<figure{kind}>{body}<figcaption><div class="key">{esc(cell.key)}</div>'
                     f'{label}<div class="meta">{esc(meta)}</div></figcaption></figure>')
    parts.append("</div></body></html>")
    return "\n".join(parts) + "\n"
