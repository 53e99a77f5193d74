"""Encoded forms are analyzed decoded: percent-encoding, HTML character references and
invisible (Default_Ignorable_Code_Point) characters inside a value do not hide it, and the
replacement covers exactly the original, encoded characters."""

from __future__ import annotations

import json
import sys
import unicodedata

import pytest

from langgraph_securesaver.redaction import Redactor
from langgraph_securesaver.redaction.decoding import decoded_view, is_default_ignorable

KEY = b"d" * 32
EMAIL = "ann@example.com"


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor()


def token_of(redactor: Redactor, text: str) -> str:
    return redactor.redact(text, token_key=KEY).text


@pytest.mark.parametrize(("text", "kept_before", "kept_after"), [
    ("mailto%3Aann%40example.com", "mailto%3A", ""),
    ("https://x.test/reset?email=ann%40example.com&next=%2Fhome", "https://x.test/reset?email=",
     "&next=%2Fhome"),
    ("ann&#64;example.com", "", ""),
    ("ann&#x40;example.com wrote", "", " wrote"),
    ("<a href='mailto:ann&commat;example.com'>", "<a href='mailto:", "'>"),
    ("ann&#64;example&#46;com", "", ""),
    ("ann%40example%2Ecom", "", ""),
    ("an\u3164n@example.com", "", ""),
    ("a\u115fnn@example.com", "", ""),
    ("ann\u1160@example.com", "", ""),
    ("ann@exam\uffa0ple.com", "", ""),
    ("ann@\u2060example.com", "", ""),
    ("an\U000e0041n@example.com", "", ""),  # a tag character
])
def test_encoded_email_is_tokenized_like_the_plain_one(redactor: Redactor, text: str,
                                                       kept_before: str,
                                                       kept_after: str) -> None:
    plain = token_of(redactor, EMAIL)
    out = token_of(redactor, text)
    assert out == kept_before + plain + kept_after
    # the replacement covers the original span: nothing of the address is left
    assert "ann" not in out and "example" not in out.replace("example.com'", "")


def test_the_detection_span_is_the_original_encoded_span(redactor: Redactor) -> None:
    text = "to: ann%40example.com."
    (entity,) = redactor.redact(text, token_key=KEY).entities
    assert text[entity.start:entity.end] == "ann%40example.com" == entity.text


def test_encoded_phone_and_card_in_a_query_string(redactor: Redactor) -> None:
    out = token_of(redactor, "GET /sms?to=%2B44%207700%20900657&card=4111%201111%201111%201111")
    assert "7700" not in out and "1111" not in out
    assert "<CREDIT_CARD:masked>" in out


def test_encoded_json_tool_result_is_redacted_in_place(redactor: Redactor) -> None:
    doc = json.dumps({"link": "https://a.test/u?e=ann%40example.com", "n": 1})
    out, vault = redactor.redact_value(doc, channel="x", token_key=KEY)
    assert "ann" not in out and json.loads(out)["n"] == 1
    assert [e.value for e in vault] == ["ann%40example.com"]


@pytest.mark.parametrize("text", [
    "100%25 done, see https://a.test/?q=%20x&amp;y=1 and &lt;b&gt;bold&lt;/b&gt;",
    "50% off &amp; more &copy; 2024", "%E4%BD%A0%E5%A5%BD", "&#12345; &#x1F600;",
    "percent %zz %4 &#; &bogus; &#99999999;",
])
def test_ordinary_encoded_text_is_left_alone(redactor: Redactor, text: str) -> None:
    result = redactor.redact(text, token_key=KEY)
    assert result.text == text and result.entities == []


def test_decoded_view_maps_every_character_back() -> None:
    text = "a%E4%BD%A0b&#64;c&amp;%zz%C3%28"
    decoded, starts, ends = decoded_view(text)  # type: ignore[misc]
    assert decoded == "a\u4f60b@c&%zz%C3("
    assert [text[s:e] for s, e in zip(starts, ends, strict=True)] == [
        "a", "%E4%BD%A0", "b", "&#64;", "c", "&amp;", "%", "z", "z", "%", "C", "3", "%28"]
    assert decoded_view("nothing to decode %zz") is None


def test_default_ignorables_come_from_the_unicode_property() -> None:
    for cp in (0x115F, 0x1160, 0x3164, 0xFFA0, 0x200B, 0x2060, 0xFE0F, 0xE0041, 0x00AD):
        assert is_default_ignorable(chr(cp)), hex(cp)
    for ch in "a@.1 \u3000\u4e00":
        assert not is_default_ignorable(ch)
    # every format control (Cf) but a handful of visible ones is in the property
    cf = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
    assert sum(map(is_default_ignorable, cf)) > 0.8 * len(cf)
