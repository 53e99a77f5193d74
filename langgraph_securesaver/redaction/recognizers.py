"""The recognizers of the default engine.

Every recognizer here is a :class:`LinearRecognizer`: a presidio ``EntityRecognizer`` that runs
a few compiled standard-library regular expressions whose running time is linear in the text
(every repetition is either bounded or cannot overlap a neighbouring one, and no look-behind
holds an unbounded repetition). None of them goes through presidio's ``PatternRecognizer``,
whose e-mail pattern is super-linear and which *skips* a pattern that hits its regex timeout
(the match is then lost: fail-open).

The recognizers run on the redactor's *analysis view* of the text (see
``redactor.analysis_view``): compatibility forms folded to ASCII (full-width letters, digits
and punctuation, every kind of space and dash, non-ASCII decimal digits), CJK and other
scripts blanked. Patterns therefore only deal with ASCII, and use ASCII look-arounds instead of
``\\b``. Patterns are case-sensitive unless they say otherwise (``akia…`` is no AWS key).

Validation that needs more than a pattern (Luhn and issuer ranges, ISO 7064 checksums, dates,
a public-suffix check) happens in the recognizer; label vetoes ("order no.", "version") that
need the original text are applied by the redactor (:func:`label_veto`).

The recognizers live in one module per family (presidio's "one small class per
recognizer"): :mod:`.linear` (the base), :mod:`.contact_recognizers`,
:mod:`.number_recognizers`, :mod:`.secret_recognizers`; the label vetoes in :mod:`.vetoes`.
This module gathers their public names and holds :data:`CANDIDATE_RE`, the pre-filter every
recognizer's shapes must pass.
"""

from __future__ import annotations

import re

from presidio_analyzer import EntityRecognizer

from .contact_recognizers import (
    CnMobileRecognizer,
    CnResidentIdRecognizer,
    LinearPhoneRecognizer,
    OfflineEmailRecognizer,
    PhoneShapeRecognizer,
    cn_id_check_char,
    is_valid_cn_resident_id,
)
from .linear import API_SECRET, CN_MOBILE, CN_RESIDENT_ID, LinearRecognizer, Rx, rx
from .number_recognizers import (
    LabelAwareIpRecognizer,
    LinearUsSsnRecognizer,
    StrictCreditCardRecognizer,
    is_plausible_card,
    luhn_ok,
)
from .secret_recognizers import ApiSecretRecognizer, private_key_spans
from .vetoes import LABEL_VETOES, label_veto

__all__ = [
    "API_SECRET",
    "CN_MOBILE",
    "CN_RESIDENT_ID",
    "LABEL_VETOES",
    "ApiSecretRecognizer",
    "CnMobileRecognizer",
    "CnResidentIdRecognizer",
    "EntityRecognizer",
    "LabelAwareIpRecognizer",
    "LinearPhoneRecognizer",
    "LinearRecognizer",
    "LinearUsSsnRecognizer",
    "OfflineEmailRecognizer",
    "PhoneShapeRecognizer",
    "Rx",
    "StrictCreditCardRecognizer",
    "cn_id_check_char",
    "is_plausible_card",
    "is_valid_cn_resident_id",
    "label_veto",
    "luhn_ok",
    "private_key_spans",
    "rx",
]


# A cheap, conservative pre-filter on the analysis view: text in which none of these shapes
# occurs cannot match any built-in recognizer, so no recognizer is called for it (most chat
# turns). Every recognizer above needs one of: an "@", seven or more digits (separators
# allowed), a dotted quad or a hex:hex: IPv6 shape, a long alphanumeric run (keys, tokens,
# crypto addresses, IBANs) or a secret's label/prefix.
CANDIDATE_RE = re.compile(
    r"@"
    r"|[0-9](?:[\s\-.()/]{0,3}[0-9]){6,}"
    r"|[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}"
    r"|[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:"
    r"|[A-Za-z0-9_\-+/=]{20,}"
    r"|sk[-_]|rk_|AKIA|ASIA|gh[pousr]_|github_pat_|gl[a-z]{1,5}-|hf_|npm_|SG\.|eyJ|BEGIN|"
    r"xox[abposre]-|AIza|://"
    r"|(?i:bearer|basic|secret|passw|pwd|api[_-]?key|token|aws|accountkey|sig=)"
    # national IDs with letters (UK NINO, IT codice fiscale, IN PAN; see .id_recognizers)
    r"|[A-Z]{2} ?[0-9]{2} ?[0-9]{2} ?[0-9]{2} ?[A-Z]|[A-Z]{6}[0-9LMNPQRSTUV]{2}[A-Z]"
    r"|[A-Z]{5}[0-9]{4}[A-Z]",
    re.ASCII,
)
