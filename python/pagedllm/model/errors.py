"""The one exception the model package raises for a checkpoint it cannot use."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded as given.

    Raised for a missing or unreadable file, a config field that is missing, invalid or
    unsupported, a tensor that is missing, unexpected, of the wrong shape or of an unusable
    dtype, and for a config that contradicts the weights. The message names the file (and the
    field or tensor) and says what was expected. Nothing is left half-loaded when it is raised.
    """
