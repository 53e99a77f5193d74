"""Offline construction of the presidio ``AnalyzerEngine`` the redactor uses.

The default engine runs no NLP model (presidio's ``NoOpNlpEngine``) and an explicit list of
pattern/checksum recognizers: nothing is downloaded, nothing is loaded from disk beyond the
installed packages, and startup takes well under a second.

Named-entity recognition (PERSON, LOCATION) is an explicit opt-in: pass an NLP engine you
configured with a model you installed and trust (:func:`spacy_ner_engine` builds one for a
spaCy model that is already installed or a local model directory). A model that is not present
is refused with :class:`RedactionError`; this module never downloads one.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from presidio_analyzer import AnalyzerEngine, EntityRecognizer, RecognizerRegistry
from presidio_analyzer.nlp_engine import NlpArtifacts, NlpEngine, NoOpNlpEngine
from presidio_analyzer.predefined_recognizers import (
    CryptoRecognizer,
    IbanRecognizer,
)

from .errors import RedactionError
from .id_recognizers import NATIONAL_ID_KINDS, NationalIdRecognizer
from .recognizers import (
    ApiSecretRecognizer,
    CnMobileRecognizer,
    CnResidentIdRecognizer,
    LabelAwareIpRecognizer,
    LinearPhoneRecognizer,
    LinearUsSsnRecognizer,
    OfflineEmailRecognizer,
    PhoneShapeRecognizer,
    StrictCreditCardRecognizer,
)

logger = logging.getLogger(__name__)

LANGUAGE = "en"
DEFAULT_PHONE_REGIONS: tuple[str, ...] = ("US", "GB", "CN")
DEFAULT_NER_ENTITIES: tuple[str, ...] = ("PERSON", "LOCATION")

# Entity kinds the default engine can report.
PATTERN_ENTITIES: tuple[str, ...] = tuple(sorted((
    "API_SECRET",
    "CN_MOBILE",
    "CN_RESIDENT_ID",
    "CREDIT_CARD",
    "CRYPTO",
    "EMAIL_ADDRESS",
    "IBAN_CODE",
    "IP_ADDRESS",
    "PHONE_NUMBER",
    "US_SSN",
    *NATIONAL_ID_KINDS,
)))


def default_recognizers(phone_regions: Sequence[str] = DEFAULT_PHONE_REGIONS,
                        language: str = LANGUAGE) -> list[EntityRecognizer]:
    """The recognizers of the default engine, one instance each.

    Deliberately absent from presidio's generic set: DATE_TIME, UUID, MAC and URL (they flag
    timestamps, ids and links that are not personal data) and the country-specific ID
    recognizers (they misfire on order numbers outside their country). presidio's own
    e-mail, card, IP, SSN and phone recognizers are replaced by linear-time ones (see
    ``recognizers``; phones are still validated by ``phonenumbers``); its IBAN and
    crypto-wallet recognizers stay.
    """
    regions = tuple(r.upper() for r in phone_regions)
    return [
        OfflineEmailRecognizer(supported_language=language),
        LinearPhoneRecognizer(supported_language=language, supported_regions=regions),
        PhoneShapeRecognizer(supported_language=language),
        StrictCreditCardRecognizer(supported_language=language),
        IbanRecognizer(supported_language=language),
        LabelAwareIpRecognizer(supported_language=language),
        CryptoRecognizer(supported_language=language),
        LinearUsSsnRecognizer(supported_language=language),
        CnResidentIdRecognizer(supported_language=language),
        CnMobileRecognizer(supported_language=language),
        ApiSecretRecognizer(supported_language=language),
        NationalIdRecognizer(supported_language=language),
    ]


def _model_present(name: str) -> bool:
    import spacy.util

    return bool(spacy.util.is_package(name)) or Path(name).exists()


def spacy_ner_engine(model: str, *, language: str = LANGUAGE) -> NlpEngine:
    """A loaded presidio spaCy engine for an installed spaCy package or a local model
    directory. Raises :class:`RedactionError` instead of downloading a missing model."""
    from presidio_analyzer.nlp_engine import SpacyNlpEngine

    if not _model_present(model):
        raise RedactionError(
            f"spaCy model {model!r} is not installed and is never downloaded by "
            "langgraph-securesaver: install it yourself (or pass a local model directory) "
            "and try again, or leave NER off")
    engine = SpacyNlpEngine(models=[{"lang_code": language, "model_name": model}])
    engine.load()
    return engine


def _refuse_download(nlp_engine: NlpEngine) -> None:
    """Make sure loading ``nlp_engine`` cannot trigger a model download."""
    if nlp_engine.is_loaded():
        return
    models: Iterable[Any] = getattr(nlp_engine, "models", None) or []
    for model in models:
        name = model.get("model_name") if isinstance(model, dict) else None
        if isinstance(name, str) and not _model_present(name):
            raise RedactionError(
                f"the NLP engine names model {name!r}, which is not installed; presidio would "
                "try to download it. Install it yourself or load the engine before passing it")
    if not models:
        raise RedactionError(
            f"pass a loaded NLP engine ({type(nlp_engine).__name__} is not loaded yet), so "
            "that no model is fetched on first use")


def build_analyzer(*, phone_regions: Sequence[str] = DEFAULT_PHONE_REGIONS,
                   nlp_engine: NlpEngine | None = None,
                   ner_entities: Sequence[str] = DEFAULT_NER_ENTITIES,
                   extra_recognizers: Iterable[EntityRecognizer] = (),
                   language: str = LANGUAGE) -> AnalyzerEngine:
    """Build an ``AnalyzerEngine`` with the redaction recognizers.

    ``nlp_engine=None`` (the default) means no NER and no model. With an engine (e.g. from
    :func:`spacy_ner_engine`), its NER recognizer is added for ``ner_entities`` only.
    """
    recognizers = default_recognizers(phone_regions, language)
    recognizers.extend(extra_recognizers)
    if nlp_engine is None:
        engine: NlpEngine = NoOpNlpEngine(models=[{"lang_code": language, "model_name": "none"}])
        engine.load()
    else:
        _refuse_download(nlp_engine)
        engine = nlp_engine
    registry = RecognizerRegistry(recognizers=recognizers, supported_languages=[language])
    if not isinstance(engine, NoOpNlpEngine):
        nlp_cls = RecognizerRegistry.get_nlp_recognizer(engine)
        registry.add_recognizer(nlp_cls(supported_language=language,
                                        supported_entities=list(ner_entities)))
    analyzer = AnalyzerEngine(registry=registry, nlp_engine=engine,
                              supported_languages=[language])
    logger.debug("built presidio analyzer with %d recognizers (NER: %s)",
                 len(list(registry.recognizers)), not isinstance(engine, NoOpNlpEngine))
    return analyzer


def empty_artifacts(language: str = LANGUAGE) -> NlpArtifacts:
    """NLP artifacts with no tokens, for pattern-only passes (skips the NLP pipeline)."""
    noop = NoOpNlpEngine(models=[{"lang_code": language, "model_name": "none"}])
    noop.load()
    return noop.process_text("", language)


def ner_entities_of(analyzer: AnalyzerEngine, language: str = LANGUAGE) -> frozenset[str]:
    """Entities that need the NLP pipeline (those of NLP-engine recognizers)."""
    from presidio_analyzer.predefined_recognizers import SpacyRecognizer

    if isinstance(analyzer.nlp_engine, NoOpNlpEngine):
        return frozenset()
    out: set[str] = set()
    for rec in analyzer.registry.get_recognizers(language=language, all_fields=True):
        if isinstance(rec, SpacyRecognizer):
            out.update(rec.get_supported_entities())
    return frozenset(out)


_SHARED: dict[tuple[str, ...], AnalyzerEngine] = {}
_SHARED_LOCK = threading.Lock()
_HEAP_FROZEN = False


def freeze_long_lived_heap() -> bool:
    """Once per process: collect, then move every object alive now into the collector's
    permanent generation (``gc.freeze()``).

    Called after the analysis engine is built (its recognizers, the phone metadata and the
    public-suffix snapshot are ~200k objects that live as long as the process). Without it
    every full (generation-2) collection walks them all while holding the GIL: 40-200 ms
    during which no other thread runs, so an ``aput`` whose redaction happens to trigger one
    in its worker thread stalls the caller's event loop that long. Frozen objects are still
    freed by reference counting; only cyclic garbage among them is never collected (undo with
    ``gc.unfreeze()``). Returns whether this call froze the heap."""
    global _HEAP_FROZEN
    with _SHARED_LOCK:
        if _HEAP_FROZEN or not gc.isenabled():
            return False
        gc.collect()
        gc.freeze()
        _HEAP_FROZEN = True
    logger.debug("froze %d long-lived objects out of the cyclic collector", gc.get_freeze_count())
    return True


def shared_analyzer(phone_regions: Sequence[str] = DEFAULT_PHONE_REGIONS) -> AnalyzerEngine:
    """The process-wide default engine for ``phone_regions``, built on first use."""
    key = tuple(r.upper() for r in phone_regions)
    analyzer = _SHARED.get(key)
    if analyzer is not None:
        return analyzer
    with _SHARED_LOCK:
        analyzer = _SHARED.get(key)
        if analyzer is None:
            analyzer = build_analyzer(phone_regions=key)
            # Load what recognizers load lazily (public-suffix snapshot, phone metadata) now,
            # so that the first real redaction is not the slow one.
            analyzer.analyze("warm-up: a.b@example.com +1 212 555 0100 13812345678 10.0.0.1",
                             language=LANGUAGE)
            _SHARED[key] = analyzer
        return analyzer
