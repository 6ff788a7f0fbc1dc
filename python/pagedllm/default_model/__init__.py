"""The default model that ships inside the package: what runs when no model is given.

A ~4M-parameter Llama trained on the Python documentation that every CPython carries, stored in
the Hugging Face layout (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``, ``generation_config.json``). ``TRAINING.md`` beside the files records
how it was made; ``python -m pagedllm.tools.train_default_model`` makes it again.
"""

from __future__ import annotations

import os
from importlib import resources

# The files a loader needs; all must be present for the directory to count as a model.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json")


def default_model_path() -> str:
    """Returns the directory of the bundled default model, usable as a model path.

    Returns:
        An absolute filesystem path holding the files in ``REQUIRED_FILES``.
    Raises:
        RuntimeError: the package is not on a real filesystem (e.g. imported from a zip) or
            the model files are missing from the installation.
    """
    path = str(resources.files(__name__))
    if not os.path.isdir(path):
        raise RuntimeError(
            f"the bundled default model must be on a real filesystem, but pagedllm.default_model "
            f"resolves to {path!r}; install pagedllm as a regular (unzipped) package"
        )
    missing = [name for name in REQUIRED_FILES if not os.path.isfile(os.path.join(path, name))]
    if missing:
        raise RuntimeError(
            f"the bundled default model in {path} lacks {', '.join(missing)}; the installation is "
            f"incomplete (rebuild it with: python -m pagedllm.tools.train_default_model --out {path})"
        )
    return os.path.abspath(path)
