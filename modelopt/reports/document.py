"""A report as a list of blocks, rendered to Markdown (figures as PNG files beside it) and to one
self-contained HTML page (figures inlined as base64 data URIs, styles inline, no external assets)."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modelopt._files import write_atomic
from modelopt.run.layout import REPORT_FILES, REPORT_HTML, REPORT_MD

__all__ = ["Block", "Figure", "Heading", "Markdown", "Paragraph", "ReportPaths", "Table", "render_html",
           "render_markdown", "write_document"]


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str  # inline Markdown: **bold**, `code`


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    align: str = ""  # one of l/r per column; default: first left, others right


@dataclass(frozen=True)
class Figure:
    name: str  # file stem of the PNG beside report.md
    png: bytes
    caption: str


@dataclass(frozen=True)
class Markdown:
    text: str  # Markdown written elsewhere (a sweep's table.md): headings, paragraphs, pipe tables


Block = Heading | Paragraph | Table | Figure | Markdown


def _aligns(table: Table) -> str:
    n = len(table.header)
    return (table.align or "l" + "r" * (n - 1)).ljust(n, "r")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(blocks: Sequence[Block], image_dir: str) -> str:
    """Markdown with figures as `![caption](image_dir/name.png)`."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Paragraph):
            out.append(b.text)
        elif isinstance(b, Table):
            seps = ["---:" if a == "r" else "---" for a in _aligns(b)]
            lines = ["| " + " | ".join(map(_md_cell, b.header)) + " |", "| " + " | ".join(seps) + " |"]
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in b.rows]
            out.append("\n".join(lines))
        elif isinstance(b, Figure):
            out.append(f"![{b.caption}]({image_dir}/{b.name}.png)\n\n*{b.caption}*")
        elif isinstance(b, Markdown):  # its headings sit under the report's own section heading
            out.append(re.sub(r"^(#{1,4}) ", r"##\1 ", b.text.strip(), flags=re.MULTILINE))
    return "\n\n".join(out) + "\n"


_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")


def _inline(text: str) -> str:
    parts = _CODE.split(text)  # odd items are code spans: no formatting inside them
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
        else:
            out.append(_BOLD.sub(r"<strong>\1</strong>", html.escape(part)))
    return "".join(out)


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], aligns: str) -> str:
    def cls(i: int) -> str:
        return ' class="num"' if aligns[i] == "r" else ""

    head = "".join(f"<th{cls(i)}>{_inline(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{_inline(c)}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _split_row(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def _markdown_to_html(text: str) -> str:
    """The Markdown the sweep table writes: headings, paragraphs and pipe tables (nothing more)."""
    out: list[str] = []
    para: list[str] = []
    lines = text.splitlines()

    def flush() -> None:
        if para:
            out.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()

    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if not line.strip():
            flush()
        elif m := re.match(r"^(#{1,6})\s+(.*)$", line):
            flush()
            level = min(len(m.group(1)) + 2, 6)  # nested under the report's own (h1 title, h2 section)
            out.append(f"<h{level}>{_inline(m.group(2))}</h{level}>")
        elif line.lstrip().startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1]):
            flush()
            header = _split_row(line)
            aligns = "".join("r" if c.endswith(":") else "l" for c in _split_row(lines[i + 1]))
            rows = []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(_split_row(lines[i]))
                i += 1
            out.append(_html_table(header, rows, aligns.ljust(len(header), "l")))
            continue
        else:
            para.append(line.strip())
        i += 1
    flush()
    return "\n".join(out)


_STYLE = """
body { font-family: -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; color: #1f2328;
       max-width: 1120px; margin: 24px auto; padding: 0 20px; line-height: 1.45; font-size: 15px; }
h1 { font-size: 26px; border-bottom: 1px solid #d0d7de; padding-bottom: 6px; }
h2 { font-size: 20px; margin-top: 32px; border-bottom: 1px solid #eaeef2; padding-bottom: 4px; }
h3 { font-size: 17px; margin-top: 24px; }
code { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 13px; background: #f3f4f6;
       padding: 1px 4px; border-radius: 4px; }
.scroll { overflow-x: auto; margin: 10px 0 18px; }
table { border-collapse: collapse; font-size: 13.5px; }
th, td { border: 1px solid #d0d7de; padding: 4px 10px; text-align: left; white-space: nowrap; }
th { background: #f6f8fa; font-weight: 600; white-space: normal; vertical-align: bottom; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #fafbfc; }
figure { margin: 14px 0 24px; }
figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption { color: #57606a; font-size: 13.5px; margin-top: 4px; }
"""


def render_html(blocks: Sequence[Block], title: str) -> str:
    """One HTML page with every figure inlined: it opens anywhere, offline, as a single file."""
    body: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{_inline(b.text)}</h{b.level}>")
        elif isinstance(b, Paragraph):
            body.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Table):
            body.append(_html_table(b.header, b.rows, _aligns(b)))
        elif isinstance(b, Figure):
            data = base64.b64encode(b.png).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(b.caption)}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{_inline(b.caption)}</figcaption></figure>")
        elif isinstance(b, Markdown):
            body.append(_markdown_to_html(b.text))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


@dataclass(frozen=True)
class ReportPaths:
    """What a report wrote."""

    markdown: Path
    html: Path
    images: tuple[Path, ...]


def write_document(out_dir: Path, blocks: Sequence[Block], title: str) -> ReportPaths:
    """Writes `report.md`, its PNGs under `report_files/`, and the self-contained `report.html`."""
    img_dir = out_dir / REPORT_FILES
    img_dir.mkdir(exist_ok=True)
    images = []
    for b in blocks:
        if isinstance(b, Figure):
            path = img_dir / f"{b.name}.png"
            write_atomic(path, b.png, durable=False)
            images.append(path)
    md, page = out_dir / REPORT_MD, out_dir / REPORT_HTML
    # Atomic: a reader (or a report written at the same time) sees a whole page, never half of one.
    write_atomic(md, render_markdown(blocks, REPORT_FILES), durable=False)
    write_atomic(page, render_html(blocks, title), durable=False)
    return ReportPaths(md, page, tuple(images))
