"""Detection, policy and token tests for langgraph_securesaver.redaction (real presidio)."""


from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

import pytest

from langgraph_securesaver.errors import ConfigurationError
from langgraph_securesaver.redaction import (
    TOKEN_RE,
    Action,
    RedactionError,
    RedactionPolicy,
    Redactor,
    build_analyzer,
    make_token,
    spacy_ner_engine,
)

KEY = b"k" * 32
OTHER_KEY = b"o" * 32

# Independent implementation of GB 11643 (not the library's) to build test IDs.
_W = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


def make_id(region: str, born: str, seq: str, *, corrupt: bool = False) -> str:
    body = region + born + seq
    check = "10X98765432"[sum(int(d) * w for d, w in zip(body, _W, strict=True)) % 11]
    if corrupt:
        check = "1" if check != "1" else "2"
    return body + check


VALID_IDS = [
    make_id("110105", "19491231", "002"),  # the textbook example, ends in X
    make_id("440305", "19900307", "123"),
    make_id("310104", "20010228", "456"),
    make_id("510107", "19650815", "789"),
]


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor()


def kinds(redactor: Redactor, text: str) -> list[tuple[str, str]]:
    return [(e.kind, e.text) for e in redactor.redact(text, token_key=KEY).entities]


# ------------------------------------------------------------------------- Chinese ID numbers
def test_textbook_id_has_x_check_character() -> None:
    assert VALID_IDS[0] == "11010519491231002X"


@pytest.mark.parametrize("cn_id", VALID_IDS)
def test_valid_resident_ids_are_detected(redactor: Redactor, cn_id: str) -> None:
    text = f"我的身份证号是{cn_id}，请核实"
    assert ("CN_RESIDENT_ID", cn_id) in kinds(redactor, text)
    assert cn_id not in redactor.redact(text, token_key=KEY).text


def test_resident_id_lowercase_x_and_grouped(redactor: Redactor) -> None:
    lower = VALID_IDS[0][:-1] + "x"
    grouped = f"{VALID_IDS[1][:6]} {VALID_IDS[1][6:14]} {VALID_IDS[1][14:]}"
    assert ("CN_RESIDENT_ID", lower) in kinds(redactor, f"id {lower} ok")
    assert ("CN_RESIDENT_ID", grouped) in kinds(redactor, f"证件号 {grouped}")


@pytest.mark.parametrize("bad", [
    make_id("440305", "19900307", "123", corrupt=True),  # wrong check character
    make_id("110105", "20990101", "001"),  # birth date in the future
    make_id("110105", "19900230", "001"),  # 30 February
    make_id("110105", "18990101", "001"),  # before 1900
    "012345" + make_id("110105", "19900101", "001")[6:],  # region cannot start with 0
])
def test_invalid_resident_ids_are_not_detected(redactor: Redactor, bad: str) -> None:
    assert [k for k, _ in kinds(redactor, f"身份证{bad}")] == []


def test_future_birth_date_is_relative_to_today(redactor: Redactor) -> None:
    tomorrow = datetime.date.today() + datetime.timedelta(days=1)
    cn_id = make_id("110105", tomorrow.strftime("%Y%m%d"), "001")
    assert kinds(redactor, f"身份证{cn_id}") == []


# ------------------------------------------------------------------------- Chinese mobiles
@pytest.mark.parametrize("mobile", [
    "13812345678", "+8613812345678", "+86 13812345678", "008613812345678",
    "138 1234 5678", "138-1234-5678", "+86 138 1234 5678", "+86-139-1234-5678",
])
def test_cn_mobiles_with_prefix_and_separators(redactor: Redactor, mobile: str) -> None:
    found = kinds(redactor, f"我的手机是{mobile}，谢谢")
    assert ("CN_MOBILE", mobile) in found


@pytest.mark.parametrize("text", [
    "号码12812345678无效",  # 12x is not a mobile prefix
    "流水号 138123456789",  # 12 digits
    "value 1381234567",  # 10 digits
    "Meeting ID: 131 6640 5109",  # labelled as a meeting id
])
def test_not_cn_mobiles(redactor: Redactor, text: str) -> None:
    assert all(k != "CN_MOBILE" for k, _ in kinds(redactor, text))


def test_full_width_digits_mobile(redactor: Redactor) -> None:
    text = "电话：１３８１２３４５６７８"
    assert [k for k, _ in kinds(redactor, text)] == ["CN_MOBILE"]


# ------------------------------------------------------------------------- CJK boundaries
def test_email_inside_chinese_without_spaces(redactor: Redactor) -> None:
    result = redactor.redact("邮箱是a.b@example.com请联系", token_key=KEY)
    assert [(e.kind, e.text) for e in result.entities] == [("EMAIL_ADDRESS", "a.b@example.com")]
    assert result.text.startswith("邮箱是<EMAIL_ADDRESS:") and result.text.endswith(">请联系")


@pytest.mark.parametrize("text,ip", [
    ("IP是10.0.0.1", "10.0.0.1"),
    ("登录IP64.13.195.81异常", "64.13.195.81"),
    ("客户端IP：2408:8207:2da4:27c6:5877:9f82:6f11:8ff0，登录地：杭州",
     "2408:8207:2da4:27c6:5877:9f82:6f11:8ff0"),
])
def test_ip_inside_chinese(redactor: Redactor, text: str, ip: str) -> None:
    assert ("IP_ADDRESS", ip) in kinds(redactor, text)


def test_chinese_date_is_not_a_phone_number(redactor: Redactor) -> None:
    assert kinds(redactor, "更新时间：2023年11月15日 08:30") == []


# ------------------------------------------------------------------------- secrets
SECRETS = {
    "openai": "sk-" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5bC7dE9fG1hJ3",
    "openai_project": "sk-proj-" + "Xy7_Kp2-Lm9Qr4St8Uv1Wx6Yz3Ab5Cd0Ef2Gh4Ij6Kl8Mn",
    "aws_akia": "AKIAIOSFODNN7EXAMPLE",
    "aws_asia": "ASIAY34FZKBOKMUTVV7A",
    "github_ghp": "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "github_gho": "gho_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2",
    "github_ghu": "ghu_" + "b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9",
    "github_ghs": "ghs_" + "C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0",
    "github_ghr": "ghr_" + "d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1",
    "github_pat": "github_pat_" + "11ABCDEFG0123456789abc_" + "x" * 20 + "Y7" * 20,
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
           "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "stripe": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
}


@pytest.mark.parametrize("family", sorted(SECRETS))
def test_each_secret_family_is_masked(redactor: Redactor, family: str) -> None:
    secret = SECRETS[family]
    result = redactor.redact(f"my credential is {secret} ok", token_key=KEY)
    assert [(e.kind, e.text) for e in result.entities] == [("API_SECRET", secret)]
    assert result.text == "my credential is <API_SECRET:masked> ok"
    assert result.vault == []  # secrets are irreversible: nothing goes to the vault


@pytest.mark.parametrize("line", [
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    'AWS_SECRET_ACCESS_KEY="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
])
def test_labelled_aws_secret(redactor: Redactor, line: str) -> None:
    result = redactor.redact(line, token_key=KEY)
    assert "wJalrXUtnFEMI" not in result.text and "<API_SECRET:masked>" in result.text
    unlabelled = redactor.redact("blob wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", token_key=KEY)
    assert unlabelled.entities == []  # 40 base64 characters alone are not a secret


def test_bearer_token_keeps_the_scheme(redactor: Redactor) -> None:
    result = redactor.redact("Authorization: Bearer abcDEF0123456789ghiJKL", token_key=KEY)
    assert result.text == "Authorization: Bearer <API_SECRET:masked>"


def test_private_key_block(redactor: Redactor) -> None:
    pem = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgH\n"
           "cTz6sE2I2yPB1aVtSxcXaDNFMFZhf2kC3eVKcxl/DPmKmDmzWbz1\n-----END RSA PRIVATE KEY-----")
    result = redactor.redact(f"key:\n{pem}\nthanks", token_key=KEY)
    assert result.text == "key:\n<API_SECRET:masked>\nthanks"
    cut = pem[:pem.index("-----END")].rstrip()  # a pasted key cut short: still masked
    result = redactor.redact(f"{cut}\nthanks, bye", token_key=KEY)
    assert result.text == "<API_SECRET:masked>\nthanks, bye"


@pytest.mark.parametrize("text", [
    "the key is akiaiosfodnn7example in lower case",  # AKIA lowercased
    "GHP_A1B2C3D4E5F6G7H8I9J0K1L2M3N4O5P6Q7R8 upper-cased prefix",
    "SK-II facial treatment essence 230ml",
    "Use a Bearer token in the Authorization header.",
    "Set OPENAI_API_KEY=sk-... in your .env file",
    "scikit-learn (sk-learn) 1.3.2 installed",
])
def test_secret_patterns_are_case_sensitive_and_not_prose(redactor: Redactor,
                                                          text: str) -> None:
    assert kinds(redactor, text) == []


# ------------------------------------------------------------------------- cards and others
def luhn_complete(body: str) -> str:
    """Append the Luhn check digit (independent of the library's implementation)."""
    for d in "0123456789":
        digits = [int(c) for c in body + d][::-1]
        total = sum(digits[0::2]) + sum(sum(divmod(2 * x, 10)) for x in digits[1::2])
        if total % 10 == 0:
            return body + d
    raise AssertionError("unreachable")


@pytest.mark.parametrize("card", [
    "4111 1111 1111 1111", "4111111111111111", "5555-5555-5555-4444", "3782 822463 10005",
    "6200000000000005", luhn_complete("621234567890123456"),  # 19-digit UnionPay
    luhn_complete("222100000000001"),  # Mastercard 2-series
])
def test_luhn_valid_cards_are_masked(redactor: Redactor, card: str) -> None:
    result = redactor.redact(f"card {card} exp 12/27", token_key=KEY)
    assert [(e.kind, e.text) for e in result.entities] == [("CREDIT_CARD", card)]
    assert result.text == "card <CREDIT_CARD:masked> exp 12/27"


@pytest.mark.parametrize("number", [
    "4111111111111112",  # Luhn fails
    "7111111111111114",  # no issuer starts with 7 (Luhn-valid)
    "5555 5555 5555 4445",  # grouped, Luhn fails
    luhn_complete("378282246310001"),  # Luhn-valid, but Amex numbers have 15 digits
])
def test_non_cards(redactor: Redactor, number: str) -> None:
    assert all(k != "CREDIT_CARD" for k, _ in kinds(redactor, f"ref {number}"))


@pytest.mark.parametrize("text", [
    "request_id=550e8400-e29b-41d4-a716-446655440000",
    "sha256: dc8c7214a0558132a56b23318f010570899485ac26a884af7f0225f6b26011c9",
    "md5 5d41402abc4b2a76b9719d911017c592",
    "版本号 1.2.0.4 已发布",
    "Upgrade to version 10.0.0.1 now",
    "订单号：2023111512345678901",
    "总价¥13,800.00，含运费",
    "Tracking number 1Z0C46O07794560054",
    "学号20210123456",
    "created_at: 1700000000123",
    "snmp oid 1.3.6.1.4.1.2021",
])
def test_hard_negatives(redactor: Redactor, text: str) -> None:
    assert kinds(redactor, text) == []


def test_phone_iban_and_ssn(redactor: Redactor) -> None:
    found = kinds(redactor, "Call (212) 555-1234, IBAN DE89 3704 0044 0532 0130 00, "
                            "SSN 219-09-9999, 办公电话010-65529988")
    assert ("PHONE_NUMBER", "(212) 555-1234") in found
    assert ("IBAN_CODE", "DE89 3704 0044 0532 0130 00") in found
    assert ("US_SSN", "219-09-9999") in found
    assert ("PHONE_NUMBER", "010-65529988") in found


# ------------------------------------------------------------------------- policy

def test_hex_ids_are_not_lower_case_ibans(redactor: Redactor) -> None:
    """A lower-case IBAN counts only in its country's format: random hex ids (receipt ids,
    UUIDs) pass the mod-97 check about once in a thousand and were redacted as IBANs (the
    at-rest scan then reported a receipt id as personal data)."""
    import random
    rng = random.Random(7)
    seen = ["ee992f019e384e2e98e666ad8ededfc9", "fa13cf43fd574bb486597eb197aedbe4",
            "bc46f6c5cea4418183fb8790d11d5cbc"]
    ids = seen + [f"{rng.getrandbits(128):032x}" for _ in range(3000)]
    assert [i for i in ids if redactor.redact(i).entities] == []
    # real lower-case IBANs keep being claimed, with and without spaces, in every country's
    # length (presidio's own formats get Portugal, Qatar, Mauritius and Palestine wrong)
    for iban in ("de89370400440532013000", "gb29 nwbk 6016 1331 9268 19",
                 "pt50 0002 0123 1234 5678 9015 4", "qa58 dohb 0000 1234 5678 90ab cdef g",
                 "mu17 bomm 0101 1010 3030 0200 000m ur", "fr14 2004 1010 0505 0001 3m02 606"):
        assert kinds(redactor, f"iban: {iban}") == [("IBAN_CODE", iban)], iban

def test_default_policy_actions() -> None:
    policy = RedactionPolicy.default()
    assert policy.action_for("EMAIL_ADDRESS") is Action.TOKENIZE
    assert policy.action_for("CN_RESIDENT_ID") is Action.TOKENIZE
    assert policy.action_for("API_SECRET") is Action.MASK
    assert policy.action_for("CREDIT_CARD") is Action.MASK
    assert policy.action_for("SOMETHING_NEW") is Action.TOKENIZE
    assert RedactionPolicy.strict().action_for("EMAIL_ADDRESS") is Action.MASK


def test_allowlist_is_case_insensitive(redactor: Redactor) -> None:
    policy = RedactionPolicy(allowlist=frozenset({"Support@Acme.com"}))
    r = Redactor(policy)
    result = r.redact("write to support@acme.com or bob@acme.com", token_key=KEY)
    assert "support@acme.com" in result.text and "bob@acme.com" not in result.text
    assert [e.text for e in result.entities] == ["bob@acme.com"]


def test_actions_tokenize_mask_drop_keep() -> None:
    policy = RedactionPolicy(actions={"EMAIL_ADDRESS": Action.DROP, "CN_MOBILE": Action.KEEP,
                                      "IP_ADDRESS": Action.MASK},
                             default_action=Action.TOKENIZE)
    r = Redactor(policy)
    result = r.redact("mail a@example.com phone 13812345678 ip 8.8.4.4 id "
                      f"{VALID_IDS[1]}", token_key=KEY)
    assert result.text.startswith("mail  phone 13812345678 ip <IP_ADDRESS:masked> id "
                                  "<CN_RESIDENT_ID:")
    assert {e.kind for e in result.entities} == {"EMAIL_ADDRESS", "CN_MOBILE", "IP_ADDRESS",
                                                 "CN_RESIDENT_ID"}  # KEEP is still reported
    assert [v.kind for v in result.vault] == ["CN_RESIDENT_ID"]


def test_score_threshold_filters_weak_kinds() -> None:
    strict_threshold = Redactor(RedactionPolicy(score_threshold=0.5))
    assert strict_threshold.redact("call (212) 555-1234", token_key=KEY).entities == []
    assert Redactor().redact("call (212) 555-1234", token_key=KEY).entities != []


def test_channels_skip_and_override(redactor: Redactor) -> None:
    policy = RedactionPolicy(channels={"scratch": None,
                                       "audit": RedactionPolicy.strict()})
    r = Redactor(policy)
    value = {"note": "a@example.com"}
    out, vault = r.redact_value(value, channel="scratch", token_key=KEY)
    assert out is value and vault == []
    out, vault = r.redact_value(value, channel="audit", token_key=KEY)
    assert out == {"note": "<EMAIL_ADDRESS:masked>"} and vault == []
    out, vault = r.redact_value(value, channel="messages", token_key=KEY)
    assert TOKEN_RE.fullmatch(out["note"]) and [v.value for v in vault] == ["a@example.com"]
    assert policy.for_channel("scratch") is None
    assert policy.for_channel(None) is policy


def test_policy_validation_and_equality() -> None:
    with pytest.raises(ConfigurationError):
        RedactionPolicy(actions={"EMAIL_ADDRESS": "shred"})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError):
        RedactionPolicy(score_threshold=2)
    with pytest.raises(ConfigurationError):
        RedactionPolicy(channels={"x": "mask"})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError):
        RedactionPolicy(allowlist="a@b.com")  # type: ignore[arg-type]
    a = RedactionPolicy(actions={"email_address": "mask"})  # type: ignore[dict-item]
    b = RedactionPolicy(actions={"EMAIL_ADDRESS": Action.MASK})
    assert a == b and hash(a) == hash(b) and a.fingerprint == b.fingerprint
    assert a != RedactionPolicy.default()
    assert dataclasses.replace(a, max_depth=50).max_depth == 50
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.max_chars = 5  # type: ignore[misc]


# ------------------------------------------------------------------------- tokens
def test_tokens_are_stable_per_key(redactor: Redactor) -> None:
    t1 = redactor.redact("a.b@example.com", token_key=KEY).text
    t2 = redactor.redact("mail A.B@Example.com", token_key=KEY).text  # normalized
    t3 = redactor.redact("a.b@example.com", token_key=OTHER_KEY).text
    assert TOKEN_RE.fullmatch(t1)
    assert t2 == "mail " + t1
    assert t3 != t1
    assert t1 == make_token(KEY, "EMAIL_ADDRESS", "a.b@example.com")
    m = TOKEN_RE.fullmatch(t1)
    assert m is not None and m.group(1) == "EMAIL_ADDRESS" and len(m.group(2)) == 32


def test_mobile_token_ignores_formatting(redactor: Redactor) -> None:
    a = redactor.redact("13812345678", token_key=KEY).text
    b = redactor.redact("+86 138-1234-5678", token_key=KEY).text
    assert a == b and a.startswith("<CN_MOBILE:")


def test_default_key_is_per_redactor() -> None:
    r1, r2 = Redactor(), Redactor()
    assert r1.redact("a@example.com").text == r1.redact("a@example.com").text
    assert r1.redact("a@example.com").text != r2.redact("a@example.com").text


def test_token_key_is_checked(redactor: Redactor) -> None:
    with pytest.raises(ConfigurationError):
        redactor.redact_value("x", channel="c", token_key=b"short")
    with pytest.raises(ConfigurationError):
        redactor.redact_value("x", channel="c", token_key=None)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- engine
def test_default_engine_is_offline_and_minimal(redactor: Redactor) -> None:
    from presidio_analyzer.nlp_engine import NoOpNlpEngine

    analyzer = redactor.analyzer
    assert isinstance(analyzer.nlp_engine, NoOpNlpEngine)
    names = {type(r).__name__ for r in analyzer.registry.recognizers}
    assert "SpacyRecognizer" not in names
    assert not {"UuidRecognizer", "DateRecognizer", "UrlRecognizer"} & names
    assert {"CnResidentIdRecognizer", "CnMobileRecognizer", "ApiSecretRecognizer"} <= names


def test_missing_ner_model_is_refused_not_downloaded() -> None:
    with pytest.raises(RedactionError, match="never downloaded"):
        spacy_ner_engine("xx_no_such_model_here")


def test_ner_opt_in_with_a_local_model(tmp_path: Path) -> None:
    import spacy

    spacy.blank("en").to_disk(tmp_path / "blank_en")
    engine = spacy_ner_engine(str(tmp_path / "blank_en"))
    analyzer = build_analyzer(nlp_engine=engine)
    names = {type(r).__name__ for r in analyzer.registry.recognizers}
    assert "SpacyRecognizer" in names
    r = Redactor(analyzer=analyzer)
    result = r.redact("Alice's email is alice@example.com", token_key=KEY)
    assert [e.kind for e in result.entities] == ["EMAIL_ADDRESS"]  # blank model: no NER hits


def test_unloaded_engine_naming_a_missing_model_is_refused() -> None:
    from presidio_analyzer.nlp_engine import SpacyNlpEngine

    engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": "xx_missing_model"}])
    with pytest.raises(RedactionError, match="not installed"):
        build_analyzer(nlp_engine=engine)
