"""Renders the JSON results into the generated blocks of docs/BENCHMARKS.md.

The page keeps its prose; every table (and figure link) sits between a pair of markers

    <!-- BEGIN generated: NAME -->
    ...
    <!-- END generated: NAME -->

and is replaced from benchmarks/results/NAME.json (run.json for the page header) each time
`python -m benchmarks` runs. A block whose JSON is missing is left as it is.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Dict, Optional

from benchmarks import report_engine as engine_md
from benchmarks import report_redesign as redesign_md
from benchmarks import report_sections as rs

BEGIN = "<!-- BEGIN generated: {} -->"
END = "<!-- END generated: {} -->"

# block name -> (JSON file stem, renderer(data, ctx) -> markdown)
BLOCKS: Dict[str, tuple] = {
    "header": ("run", rs.header),
    "throughput": ("throughput", engine_md.throughput),
    "memory": ("memory", engine_md.memory),
    "sharing": ("sharing", engine_md.sharing),
    "block_size": ("block_size", engine_md.block_size),
    "profile": ("profile", engine_md.profile),
    "preemption": ("preemption", redesign_md.preemption),
    "dtype": ("dtype", redesign_md.dtype),
    "step_overhead": ("step_overhead_ab", redesign_md.step_overhead),
    "allocator": ("allocator", rs.allocator),
    "attention_headline": ("attention_headline", rs.attention_headline),
    "attention": ("attention", rs.attention),
    "kv_dtypes": ("kv_dtypes", rs.kv_dtypes),
    "model_step": ("model_step", rs.model_step),
}


def _load(out_dir: Path, stem: str) -> Optional[dict]:
    path = out_dir / f"{stem}.json"
    return json.loads(path.read_text()) if path.exists() else None


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the content between NAME's markers replaced by `body`.

    Raises:
        ValueError: the page lacks the markers of `name`.
    """
    pattern = re.compile(re.escape(BEGIN.format(name)) + r".*?" + re.escape(END.format(name)),
                         re.S)
    if not pattern.search(text):
        raise ValueError(f"the page has no '{BEGIN.format(name)}' ... '{END.format(name)}' block")
    block = f"{BEGIN.format(name)}\n{body.strip()}\n{END.format(name)}"
    return pattern.sub(lambda _: block, text, count=1)


def update_doc(doc: Path, out_dir: Path, image_dir: Optional[Path] = None) -> list:
    """Re-renders every block of `doc` whose JSON exists in `out_dir`.

    Args:
        doc: the markdown page (edited in place).
        out_dir: where the JSON results are.
        image_dir: where the PNGs are (default out_dir); links are made relative to the page.
    Returns:
        The names of the blocks rendered.
    """
    doc, out_dir = Path(doc), Path(out_dir)
    image_dir = Path(image_dir or out_dir)
    run = _load(out_dir, "run") or {}

    def img(name: str) -> Optional[str]:
        path = image_dir / name
        return os.path.relpath(path, doc.parent) if path.exists() else None

    ctx = rs.Context(run=run, img=img, load=lambda stem: _load(out_dir, stem))
    text = doc.read_text()
    done = []
    for name, (stem, render) in BLOCKS.items():
        data = _load(out_dir, stem)
        if data is None or BEGIN.format(name) not in text:
            continue
        text = replace_block(text, name, render(data, ctx))
        done.append(name)
    doc.write_text(text)
    return done
