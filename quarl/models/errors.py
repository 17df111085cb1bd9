"""The one error type of :mod:`quarl.models`.

Every failure to find, fetch, convert or accept a model is a :class:`ModelError`
whose message names the model reference, what was wrong, and what to do about
it. It subclasses ``ValueError`` so callers that validate user input generically
still catch it.
"""

from __future__ import annotations


class ModelError(ValueError):
    """A model reference could not be resolved, converted or loaded."""
