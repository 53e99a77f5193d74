"""Redaction on hostile and real-world text: Unicode forms, data URLs, marker-shaped strings,
the recognizers' weak spots and false positives, and hostile shapes that used to take
super-linear time (their cost is measured in benchmarks/redaction_adversarial.py; here only
that the planted value is gone)."""

from __future__ import annotations

import base64

import pytest

from langgraph_securesaver.redaction import Redactor
from langgraph_securesaver.redaction.view import fold_text

KEY = b"k" * 32


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor()


def found(redactor: Redactor, text: str) -> list[tuple[str, str]]:
    return [(e.kind, e.text) for e in redactor.redact(text, token_key=KEY).entities]


# ------------------------------------------------------------------ Unicode and format bypasses
BYPASSES = [
    ("ｌｉ．ｎａ＠ｅｘａｍｐｌｅ．ｃｏｍ", "EMAIL_ADDRESS", "ｌｉ．ｎａ＠ｅｘａｍｐｌｅ．ｃｏｍ"),
    ("邮箱li．na@example．com请联系", "EMAIL_ADDRESS", "li．na@example．com"),
    ("邮箱li。na@example。com请联系", "EMAIL_ADDRESS", "li。na@example。com"),
    ("mail li\u200bna@exa\u200dmple.com now", "EMAIL_ADDRESS", "li\u200bna@exa\u200dmple.com"),
    ("手机138－1234－5678", "CN_MOBILE", "138－1234－5678"),
    ("手机138\u30001234\u30005678", "CN_MOBILE", "138\u30001234\u30005678"),
    ("手机１３８１２３４５６７８", "CN_MOBILE", "１３８１２３４５６７８"),
    ("身份证110105\u300019491231\u3000002X", "CN_RESIDENT_ID",
     "110105\u300019491231\u3000002X"),
    ("身份证 110105 1949 1231 002X", "CN_RESIDENT_ID", "110105 1949 1231 002X"),
    ("IP是１０．０．０．１", "IP_ADDRESS", "１０．０．０．１"),
    ("card 4111\u00a01111\u00a01111\u00a01111", "CREDIT_CARD", "4111\u00a01111\u00a01111\u00a01111"),
    ("carte 4111\u202f1111\u202f1111\u202f1111", "CREDIT_CARD",
     "4111\u202f1111\u202f1111\u202f1111"),
    ("card 4111.1111.1111.1111", "CREDIT_CARD", "4111.1111.1111.1111"),
    ("بطاقة ٤١١١١١١١١١١١١١١١", "CREDIT_CARD", "٤١١١١١١١١١١١١١١١"),
    ("call 212\u2013555\u20130147 today", "PHONE_NUMBER", "212\u2013555\u20130147"),
    ("call 212\u2014555\u20140147 today", "PHONE_NUMBER", "212\u2014555\u20140147"),
]


@pytest.mark.parametrize("text,kind,value", BYPASSES)
def test_unicode_forms_are_detected_and_replaced(redactor: Redactor, text: str, kind: str,
                                                 value: str) -> None:
    result = redactor.redact(text, token_key=KEY)
    assert (kind, value) in [(e.kind, e.text) for e in result.entities]
    assert value not in result.text


def test_the_fold_maps_every_view_offset_back_to_the_original() -> None:
    text = "a\u200bb ﬁle ①② ｘ＠ｙ．ｃｏ 中 e\u0301"
    view, offsets = fold_text(text)
    assert offsets is not None and len(offsets) == len(view) + 1
    assert view.startswith("ab file 12 x@y.co")
    # each folded character comes from the original character at its offset
    for i, ch in enumerate(view[:17]):
        assert ch in fold_text(text[offsets[i]])[0]


def test_tokens_of_folded_forms_equal_the_ascii_ones(redactor: Redactor) -> None:
    wide = redactor.redact("ｌｉ．ｎａ＠ｅｘａｍｐｌｅ．ｃｏｍ", token_key=KEY).text
    plain = redactor.redact("li.na@example.com", token_key=KEY).text
    assert wide == plain


# ------------------------------------------------------------------ data URLs and markers
def test_pii_in_a_text_data_url_payload_is_masked(redactor: Redactor) -> None:
    payload = base64.b64encode(b"contact li.na@example.com").decode()
    result = redactor.redact(f"see data:text/plain;base64,{payload} ok", token_key=KEY)
    assert payload not in result.text and "<EMBEDDED_PII:masked>" in result.text


def test_what_follows_a_data_url_is_analyzed(redactor: Redactor) -> None:
    image = base64.b64encode(bytes(range(256)) * 4).decode()
    text = f"data:image/png;base64,{image} then mail li.na@example.com"
    result = redactor.redact(text, token_key=KEY)
    assert "li.na@example.com" not in result.text
    assert image in result.text  # binary payloads are kept byte for byte
    assert "li.na@example.com" not in redactor.redact(
        "data:x/y;base64,li.na@example.com", token_key=KEY).text


def test_a_marker_shaped_string_is_analyzed_unless_it_is_a_known_marker(redactor: Redactor
                                                                       ) -> None:
    assert ("API_SECRET", "AKIAIOSFODNN7EXAMPLE") in found(redactor, "<AKIAIOSFODNN7EXAMPLE:masked>")
    assert ("CREDIT_CARD", "4111111111111111") in found(redactor, "<CARD_4111111111111111:masked>")
    assert found(redactor, "<EMAIL_ADDRESS:masked> and <CREDIT_CARD:masked>") == []
    glued = redactor.redact("<EMAIL_ADDRESS:masked>li.na@example.com", token_key=KEY).text
    assert "li.na@example.com" not in glued


# ------------------------------------------------------------------ weak spots
POSITIVES = [
    ("JCB 3530111333300000", "CREDIT_CARD", "3530111333300000"),
    ("JCB 213100000000001", "CREDIT_CARD", "213100000000001"),
    ("UATP 122000000000003", "CREDIT_CARD", "122000000000003"),
    ("Dankort 5019717010103742", "CREDIT_CARD", "5019717010103742"),
    ("Maestro 6759649826438453", "CREDIT_CARD", "6759649826438453"),
    ("SSN 078051121 on file", "US_SSN", "078051121"),
    ("ssn: 078-051121", "US_SSN", "078-051121"),
    ("phone 880.963.5169", "PHONE_NUMBER", "880.963.5169"),
    ("+447700 900 657", "PHONE_NUMBER", "+447700 900 657"),
    ("call 07700 900 657", "PHONE_NUMBER", "07700 900 657"),
    ("eyJhbGciOiJub25lIn0.eyJzdWIiOiIxMjM0In0", "API_SECRET",
     "eyJhbGciOiJub25lIn0.eyJzdWIiOiIxMjM0In0"),
    ('"SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"', "API_SECRET",
     "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("aws configure set aws_secret_access_key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
     "API_SECRET", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("bot 110201543:AAHdqTcvCH1vGWJxfSe1ofSAs0K5PALDsaw", "API_SECRET",
     "110201543:AAHdqTcvCH1vGWJxfSe1ofSAs0K5PALDsaw"),
    ("glpat-hellOworld380_testin", "API_SECRET", "glpat-hellOworld380_testin"),
    ("HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz12345678", "API_SECRET",
     "hf_AbCdEfGhIjKlMnOpQrStUvWxYz12345678"),
    ("npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "API_SECRET",
     "npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
    ("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", "API_SECRET",
     "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"),
    ("DefaultEndpointsProtocol=https;AccountKey=lJzRc1YdHaAA2KCNJJ1tkYwF/+mKK6Ygw0NGe170Xu592euJ"
     "v2wYUtBlV8z+qnlcNQSnIYVTkLWntUO1F8j8rQ==;", "API_SECRET",
     "lJzRc1YdHaAA2KCNJJ1tkYwF/+mKK6Ygw0NGe170Xu592euJv2wYUtBlV8z+qnlcNQSnIYVTkLWntUO1F8j8rQ=="),
    ("postgres://admin:s3cretPw@db.example.com/app", "API_SECRET", "s3cretPw"),
]


@pytest.mark.parametrize("text,kind,value", POSITIVES)
def test_weak_spots_are_detected(redactor: Redactor, text: str, kind: str, value: str) -> None:
    assert (kind, value) in found(redactor, text)


NEGATIVES = [
    "int max = 2147483647", "INV-2723916661", "uid=12894277801",
    "Mozilla/5.0 Chrome/122.0.6261.112 Safari/537.36", "升级到 3.1.2.5 版本",
    "see section 3.2.1.4", "git@github.com:org/repo.git", "snmp oid 1.3.6.1.4.1.2021",
    "IMEI: 356938035643809", "EAN 6948772782979", "created_at: 1700000000",
    "时间戳 2024/03/08 14:22:01", "uint32 max is 4294967295",
]


@pytest.mark.parametrize("text", NEGATIVES)
def test_listed_false_positives_are_vetoed(redactor: Redactor, text: str) -> None:
    assert found(redactor, text) == []


def test_an_ibans_inner_digits_are_not_a_card(redactor: Redactor) -> None:
    assert [k for k, _ in found(redactor, "IBAN DE89 3704 0044 0532 0130 00")] == ["IBAN_CODE"]
    assert "CREDIT_CARD" not in [k for k, _ in found(redactor, "FI21 A234 5600 0007 85")]


# ------------------------------------------------------------------ hostile shapes
HOSTILE = {
    "word boundary every char": "1 " + "a-" * 3000 + "@",
    "dotted digits": "1.2." * 1500 + "@",
    "digit pairs": "12-" * 2000 + "@",
    "jwt prefixes": "eyJx." * 1200,
    "sk prefixes": "sk-" * 2000,
    "private key headers": "-----BEGIN PRIVATE KEY-----" * 200,
    "bearer spaces": "Bearer" + " " * 6000 + "x",
    "labels": "password=" * 700,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_pii_after_a_hostile_prefix_is_still_removed(redactor: Redactor, name: str) -> None:
    text = HOSTILE[name] + " contact li.na@example.com card 4111 1111 1111 1111"
    out = redactor.redact(text, token_key=KEY).text
    assert "li.na@example.com" not in out and "4111 1111 1111 1111" not in out
