"""Real-world formats: NANP numbers with extensions and the 001- prefix, numbers as values of
log-line keys, Chinese mobiles in other groupings, GB mobiles in 3-4-4, SSNs named only by
their key, Maestro numbers, an address with one more group; and the shapes of log lines that
must stay (date-hours, sequence numbers, ids glued by ``_``, times, host names)."""

from __future__ import annotations

import json

import pytest

from langgraph_securesaver.redaction import Redactor

KEY = b"f" * 32


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor()


def found(redactor: Redactor, text: str) -> list[tuple[str, str]]:
    return [(e.kind, e.text) for e in redactor.redact(text, token_key=KEY).entities]


PHONE_KINDS = {"PHONE_NUMBER", "CN_MOBILE"}


@pytest.mark.parametrize(("text", "value"), [
    ("319-561-9725x5924", "319-561-9725x5924"),
    ("call (848)155-2858 today", "(848)155-2858"),
    ("+1-123-989-3168x355", "+1-123-989-3168x355"),
    ("desk 415-555-0142 ext. 12, thanks", "415-555-0142 ext. 12"),
    ("001-825-971-5082x82615", "001-825-971-5082x82615"),
    ('<a href="tel:001-825-971-5082x82615">call</a>', "001-825-971-5082x82615"),
    ('{"to": "251-914-9652x76385"}', "251-914-9652x76385"),
    ("sms.send to=+86-167-3376-0814 status=queued", "+86-167-3376-0814"),
    ("INFO notify number=001-875-439-1887 ok", "001-875-439-1887"),
    ("手机193-24004997", "193-24004997"),
    ("mobile 166 10061409", "166 10061409"),
    ("mobile 1939921 1913", "1939921 1913"),
    ("手机：１８８ ８７４５ ２７２５", "１８８ ８７４５ ２７２５"),
    ("电话 +８６ １４７ ８７４５ ２７２５", "+８６ １４７ ８７４５ ２７２５"),
    ("my mobile is 079 1161 4374", "079 1161 4374"),
])
def test_phone_formats_are_found_whole(redactor: Redactor, text: str, value: str) -> None:
    hits = found(redactor, text)
    assert any(k in PHONE_KINDS and v == value for k, v in hits), hits


def test_a_plain_ssn_named_by_its_json_key(redactor: Redactor) -> None:
    out, vault = redactor.redact_value(json.dumps({"ssn": "078051121"}), channel="c",
                                       token_key=KEY)
    assert "078051121" not in out and vault[0].kind == "US_SSN"


def test_maestro_0604_and_an_address_with_one_more_group(redactor: Redactor) -> None:
    assert ("CREDIT_CARD", "060482296633") in found(redactor, "maestro card 060482296633")
    assert ("IP_ADDRESS", "192.168.1.1") in found(redactor, "ping 192.168.1.1.1 failed")


@pytest.mark.parametrize("text", [
    "20171223-22:15:38:669|Step_Report|30002312|REPORT : 7023 5014 150432 240",
    "node 2596321 restarted after 1074289164 seconds",
    "CBS    Session: 30546354_2879516879 initialized by client WindowsUpdateAgent.",
    "2017-05-16 00:07:42.587 25746 INFO nova.osapi_compute.wsgi.server",
    "sshd[28986]: authentication failure; rhost=211-76-104-65.ebix.net.tw user=root",
    "connection from 82-68-222-194.dsl.in-addr.zen.co.uk at Sun Jul 17",
    "OID 4.9.56.47.33", "snmp oid 1.3.6.1.4.1.2021", "version 10.20.30.40.5",
    "uid=12894277801 offset=4155550142", "INV-2723916661", "Order No. 415-555-0142",
])
def test_log_line_shapes_are_not_personal_data(redactor: Redactor, text: str) -> None:
    assert found(redactor, text) == []
