"""The one exception the redaction package raises on purpose."""

from __future__ import annotations

from ..errors import SecureSaverError


class RedactionError(SecureSaverError):
    """A value could not be redacted safely, so nothing was returned for it.

    Raised (fail-closed) for structures nested deeper than the policy's ``max_depth``, cyclic
    structures, text longer than the policy's ``hard_max_chars``, dictionary keys that collide
    once redacted, NLP engines that would have to download a model, a string whose analysis
    ran past the time budget or the detection cap, and a write past its budget or its tenant's
    queue (see :mod:`.budget`, :mod:`.scheduler`). Nothing of a refused write is stored.
    """
