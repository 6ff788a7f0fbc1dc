"""Developer tools that are not part of the runtime.

``python -m pagedllm.tools.train_default_model`` rebuilds the bundled default model
(``pagedllm/default_model``) from the Python documentation shipped with CPython.
"""
