"""Structural check: the C++ library, the CUDA library and the bindings format no text through
iostreams; messages go through pagedllm::detail::Message (pagedllm/error.h), numbers by
std::to_chars.

Why: on a GPU machine's Python process (the system libstdc++ 6.0.33 under a module built by
g++ 13.3) an ostringstream wrote numbers as nothing or crashed while a message was built, so
errors came out as "block_tables[][] =  is outside the pool [0, )" or as a segfault
(docs/BENCHMARKS.md, "First runs on a GPU"). A stream also formats numbers by the process's
global locale ("1,024"). The test names each file and line that brings one back.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIRS = ("cpp/src", "cpp/include", "cuda", "python/bindings")
SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"}
IOSTREAM = re.compile(r"#\s*include\s*<(sstream|iostream|ostream|istream)>"
                      r"|std::(o|i)?stringstream|std::cout|std::cerr|std::clog")


def test_no_iostreams_in_the_libraries():
    files = [p for d in DIRS for p in sorted((ROOT / d).rglob("*")) if p.suffix in SUFFIXES]
    assert len(files) > 50, "the sources were not found under " + str(ROOT)
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
             if IOSTREAM.search(line.split("//")[0])]
    assert not found, "iostreams in the libraries (use pagedllm::detail::Message):\n" + \
        "\n".join(found)
