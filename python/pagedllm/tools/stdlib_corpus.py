"""The default model's training text: documentation that ships with every CPython.

Two sources, both offline and present on every CPython install:

* ``pydoc_data.topics``: the language reference topics behind ``help("for")`` (~465 KB).
* Docstrings of the standard library's public modules, classes and functions, gathered with
  ``inspect`` in a fresh, isolated interpreter (``python -I``), so that nothing the calling
  process imported or configured can change the text.

The text depends on the Python minor version (docstrings change between releases) and, a
little, on which optional extension modules the interpreter was built with (a module that fails
to import is skipped). ``corpus_sha256`` fingerprints the result so two machines can compare.

This file imports only the standard library: it is also run as a script by the isolated child
interpreter (``python -I stdlib_corpus.py OUT.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# Modules never imported: they open a browser or a window, print on import, start a REPL, or
# are platform-specific. Their submodules are skipped too.
SKIPPED_MODULES = frozenset(
    {
        "antigravity", "this", "tkinter", "turtle", "turtledemo", "idlelib", "readline",
        "pydoc_data", "lib2to3", "msilib", "msvcrt", "nt", "winreg", "winsound",
        "ensurepip", "venv",
    }
)
# Test packages inside the stdlib (ctypes.test, unittest.test, ...) are never imported.
_TEST_PACKAGE_NAMES = frozenset({"test", "tests", "idle_test"})
# Packages whose own docstring is kept but whose many submodules are mostly boilerplate.
NO_SUBMODULES = frozenset({"encodings"})
# Signatures whose text could differ between runs (addresses, set order) are left out.
_UNSTABLE_SIGNATURE_MARKS = (" at 0x", "{", "frozenset(")


@dataclass(frozen=True)
class Document:
    """One unit of training text: a pydoc topic or one module's docstrings."""

    title: str  # "topic:for" or "module:json"
    text: str


def pydoc_topics() -> list[Document]:
    """Returns the ``pydoc_data.topics`` entries sorted by name, one document each."""
    from pydoc_data.topics import topics

    return [Document(f"topic:{name}", topics[name].strip() + "\n") for name in sorted(topics)]


def stdlib_docstrings(python: str = sys.executable) -> list[Document]:
    """Returns one document per importable public stdlib module, sorted by module name.

    Args:
        python: the interpreter whose standard library is read; it runs this file with ``-I``.
    Returns:
        Documents titled ``module:<name>``; modules without any docstring text are omitted.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "docstrings.json")
        subprocess.run(
            [python, "-I", os.path.abspath(__file__), out_path],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=600,
        )
        with open(out_path, encoding="utf-8") as f:
            pairs = json.load(f)
    return [Document(title, text) for title, text in pairs]


def corpus_sha256(docs: list[Document]) -> str:
    """Returns a hex SHA-256 over the titles and texts, in order."""
    h = hashlib.sha256()
    for doc in docs:
        h.update(doc.title.encode("utf-8") + b"\0" + doc.text.encode("utf-8") + b"\0")
    return h.hexdigest()


def is_validation(doc: Document, every: int = 20) -> bool:
    """True for the ~1/every documents held out for validation, chosen by a hash of the title.

    The choice depends only on the title, so a document stays on its side of the split when
    other documents appear or disappear with the Python version.
    """
    digest = hashlib.sha256(doc.title.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % every == 0


# ---- everything below runs in the isolated child interpreter ----


def _signature(obj) -> str:
    import inspect

    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return "" if any(mark in text for mark in _UNSTABLE_SIGNATURE_MARKS) else text


def _doc(obj) -> str:
    import inspect

    doc = obj.__doc__ if isinstance(getattr(obj, "__doc__", None), str) else None
    return inspect.cleandoc(doc).strip() if doc else ""


def _entry(heading: str, doc: str) -> str:
    return f"{heading}\n{doc}\n"


def _class_text(qualname: str, cls) -> list[str]:
    import inspect

    entries = []
    doc = _doc(cls)
    if doc:
        entries.append(_entry(f"class {qualname}{_signature(cls)}", doc))
    for name in sorted(vars(cls)):
        if name.startswith("_"):
            continue
        member = vars(cls)[name]
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if not (callable(member) or isinstance(member, property) or inspect.isdatadescriptor(member)):
            continue
        doc = _doc(member)
        if doc and doc != _doc(type(member)):  # skip the generic docstring of the wrapper type
            sig = _signature(member) if callable(member) else ""
            entries.append(_entry(f"{qualname}.{name}{sig}", doc))
    return entries


def _module_text(module) -> str:
    import inspect

    name = module.__name__
    entries = []
    doc = _doc(module)
    if doc:
        entries.append(_entry(f"Module {name}", doc))
    for attr in sorted(vars(module)):
        obj = vars(module)[attr]
        if attr.startswith("_") or getattr(obj, "__module__", None) != name:
            continue
        if inspect.isclass(obj):
            entries.extend(_class_text(f"{name}.{attr}", obj))
        elif callable(obj):
            doc = _doc(obj)
            if doc:
                entries.append(_entry(f"{name}.{attr}{_signature(obj)}", doc))
    return "\n".join(entries)


def _module_names() -> list[str]:
    import importlib
    import pkgutil

    names = []
    pending = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIPPED_MODULES)
    for top in pending:
        names.append(top)
        if top in NO_SUBMODULES:
            continue
        try:
            package = importlib.import_module(top)
        except BaseException:  # noqa: BLE001 - any failure means "not on this build"
            continue
        stack = [(top, list(getattr(package, "__path__", [])))]
        while stack:
            prefix, path = stack.pop()
            subs = sorted(pkgutil.iter_modules(path), key=lambda m: m.name, reverse=True)
            for info in subs:
                if info.name.startswith("_") or info.name in _TEST_PACKAGE_NAMES:
                    continue
                full = f"{prefix}.{info.name}"
                names.append(full)
                if info.ispkg:
                    try:
                        sub = importlib.import_module(full)
                    except BaseException:  # noqa: BLE001
                        continue
                    stack.append((full, list(getattr(sub, "__path__", []))))
    return sorted(set(names))


def _child_main(out_path: str) -> None:
    import importlib
    import warnings

    warnings.simplefilter("ignore")
    pairs = []
    for name in _module_names():
        try:
            module = importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - SystemExit, ImportError, OSError, ...
            continue
        text = _module_text(module)
        if text.strip():
            pairs.append((f"module:{name}", text))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(pairs, f, ensure_ascii=False)


if __name__ == "__main__":
    _child_main(sys.argv[1])
