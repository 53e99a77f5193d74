"""Issue 40's recall bar, measured on values the recognizers were not written from.

Positives (each value in three sentences: a label, prose, a JSON field; a value counts as
found when one detection of its kind -- phone and Chinese mobile count as one family --
covers all of it):

* phone numbers of twelve Faker locales (en_US, en_GB, de_DE, fr_FR, it_IT, es_ES, pt_BR,
  ko_KR, en_IN, pl_PL, nl_NL, zh_CN) exactly as Faker prints them, and the same numbers with
  an extension (Faker's own ``x1234`` where the locale writes one, else ``x`` and 2-5 digits
  or `` ext. 12``). The default engine claims a number written with ``+`` (any region) and
  the local formats of US, GB and CN; other local formats (Faker's nl_NL ``00565 93885`` is
  a local number too) are reported apart as out of scope and not counted;
* national IDs from Faker's own providers: en_GB ``ssn`` (UK NINO), fr_FR ``ssn`` (NIR),
  it_IT ``ssn`` (codice fiscale), pt_BR ``cpf``, ko_KR ``ssn`` (RRN), en_IN ``aadhaar_id``
  and ``pan``, pl_PL ``pesel``, es_ES ``nif``/``nie``, nl_NL ``ssn`` (BSN), zh_CN ``ssn``
  (resident ID), en_US ``ssn``; German Steuer-IDs made here from the published rules
  (Faker has no provider for them); IBANs of eight locales in lower case;
* provider keys made from the shapes of the public gitleaks rule set (``config/gitleaks.toml``,
  commit b58d3f1): a value per rule of every provider docs/redaction.md claims, random
  characters of the rule's class and length (hex classes in lower case, as the providers
  issue them; Slack webhooks, SendGrid keys and JWTs in the structure the providers
  issue, which the rule's character class only approximates); a Slack webhook counts when
  its path after ``services/`` is covered (the host is no secret and is kept);
* e-mail addresses from Faker's ``user_name``/``free_email_domain`` with an apostrophe
  (``o'brien``) or a ``+tag`` in the local part, in plain, quoted, ``<…>`` and ``mailto:``
  form; ASCII local parts only (an internationalized ``süßebier@`` is not claimed: the
  recognizer finds its ASCII tail only).

Hard negatives (false positives = rows with any detection): values from Faker that are no
PII of a claimed kind (UUIDs, hashes, ISBN/EAN, dates and times, versions, user agents,
file paths, URLs without credentials, prices, coordinates, product codes), Faker IDs of the
kinds above with a wrong check digit written without their name, placeholders where a secret
would go, and log and code lines written here.

None of the recognizers was tuned on this set before it was first run; the misses of that
first run and what was changed for them are in docs/benchmarks.md ("Redaction").

Targets (exit 1 when missed): recall >= 0.995 over the claimed kinds; false positives <= 1 %
of the hard-negative rows.

Usage: python benchmarks/redaction_locales_eval.py [--per-kind 30] [--errors] [--seed 4040]
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import string
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faker import Faker

from langgraph_securesaver.redaction import Redactor

RECALL_TARGET, FP_TARGET = 0.995, 0.01
FAMILY = {"CN_MOBILE": "PHONE_NUMBER"}
PHONE_LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR", "it_IT", "es_ES", "pt_BR", "ko_KR",
                 "en_IN", "pl_PL", "nl_NL", "zh_CN")
PHONE_CLAIMED_LOCAL = ("en_US", "en_GB", "zh_CN")  # the default phone regions US, GB, CN

# kind -> (label words of the sentences, Faker locale, how to make one value)
ID_SOURCES: dict[str, tuple[tuple[str, ...], str, Callable[[Any], str]]] = {
    "UK_NINO": (("National Insurance No", "NINO", "NI number"), "en_GB", lambda f: f.ssn()),
    "FR_NIR": (("N° de sécurité sociale", "NIR", "numéro INSEE"), "fr_FR", lambda f: f.ssn()),
    "IT_FISCAL_CODE": (("Codice Fiscale", "C.F.", "cod. fiscale"), "it_IT",
                       lambda f: f.ssn()),
    "BR_CPF": (("CPF nº", "CPF", "cadastro de pessoa física (CPF)"), "pt_BR",
               lambda f: f.cpf()),
    "KR_RRN": (("주민번호", "RRN", "resident registration no"), "ko_KR", lambda f: f.ssn()),
    "IN_AADHAAR": (("Aadhaar number", "UID", "aadhar no"), "en_IN", lambda f: f.aadhaar_id()),
    "IN_PAN": (("PAN card", "PAN", "permanent account number"), "en_IN", lambda f: f.pan()),
    "PL_PESEL": (("numer PESEL", "PESEL", "pesel nr"), "pl_PL", lambda f: f.pesel()),
    "ES_NIF": (("DNI/NIF", "NIF", "documento"), "es_ES", lambda f: f.nif()),
    "ES_NIE": (("NIE", "número NIE", "extranjero NIE"), "es_ES", lambda f: f.nie()),
    "NL_BSN": (("BSN-nummer", "BSN", "burgerservicenummer"), "nl_NL", lambda f: f.ssn()),
    "CN_RESIDENT_ID": (("身份证号", "ID card", "公民身份号码"), "zh_CN", lambda f: f.ssn()),
    "US_SSN": (("SSN", "social security number", "Social Security No"), "en_US",
               lambda f: f.ssn()),
}
IBAN_LOCALES = ("en_GB", "de_DE", "fr_FR", "it_IT", "es_ES", "nl_NL", "pl_PL", "pt_BR")
ID_TEMPLATES = ("{label}: {v}", "please update my {label} to {v}, thanks",
                '{{"{label}": "{v}"}}')
PHONE_TEMPLATES = ("Tel: {v}", "you can call me on {v} after five", '{{"phone": "{v}"}}')
KEY_TEMPLATES = ("{name}={v}", "I pasted {v} into the ticket by mistake",
                 '{{"{name}": "{v}"}}')
MAIL_TEMPLATES = ("write to {v} please", "contact: '{v}'", "From: Ann <{v}>",
                  "[mail](mailto:{v})")

# character classes of the rules
HEX = "0123456789abcdef"
HEXU = "0123456789abcdefABCDEF"
ALNUM = string.ascii_letters + string.digits
LOWNUM = string.ascii_lowercase + string.digits
UPNUM = string.ascii_uppercase + string.digits
WORD = ALNUM + "_"
WORDD = WORD + "-"
B64 = ALNUM + "+/"
BECH32 = "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"

Part = str | tuple[str, int, int]
# (provider as docs/redaction.md names it, gitleaks rule id, parts of a value, name used in
# the sentences)
KEY_RULES: list[tuple[str, str, tuple[Part, ...], str]] = [
    ("OpenAI", "openai-api-key", ("sk-proj-", (WORDD, 74, 74),
                                  "T3BlbkFJ", (WORDD, 74, 74)), "OPENAI_API_KEY"),
    ("OpenAI", "openai-api-key", ("sk-svcacct-", (WORDD, 58, 58), "T3BlbkFJ",
                                  (WORDD, 58, 58)), "OPENAI_API_KEY"),
    ("OpenAI", "openai-api-key", ("sk-", (ALNUM, 20, 20), "T3BlbkFJ", (ALNUM, 20, 20)),
     "openai_key"),
    ("Anthropic", "anthropic-api-key", ("sk-ant-api03-", (WORDD, 93, 93), "AA"),
     "ANTHROPIC_API_KEY"),
    ("Anthropic", "anthropic-admin-api-key", ("sk-ant-admin01-", (WORDD, 93, 93), "AA"),
     "anthropic_admin_key"),
    ("AWS", "aws-access-token", ("AKIA", ("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16, 16)),
     "aws_access_key_id"),
    ("AWS", "aws-access-token", ("ASIA", ("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16, 16)),
     "AccessKeyId"),
    ("GitHub", "github-pat", ("ghp_", (ALNUM, 36, 36)), "GITHUB_TOKEN"),
    ("GitHub", "github-oauth", ("gho_", (ALNUM, 36, 36)), "gh_oauth"),
    ("GitHub", "github-app-token", ("ghs_", (ALNUM, 36, 36)), "installation"),
    ("GitHub", "github-app-token", ("ghu_", (ALNUM, 36, 36)), "user_to_server"),
    ("GitHub", "github-refresh-token", ("ghr_", (ALNUM, 36, 36)), "refresh"),
    ("GitHub", "github-fine-grained-pat", ("github_pat_", (WORD, 82, 82)), "GH_PAT"),
    ("GitLab", "gitlab-pat", ("glpat-", (WORDD, 20, 20)), "GITLAB_TOKEN"),
    ("GitLab", "gitlab-pat-routable", ("glpat-", (WORDD, 27, 60), ".", (LOWNUM, 2, 2),
                                       (LOWNUM, 7, 7)), "GITLAB_TOKEN"),
    ("GitLab", "gitlab-deploy-token", ("gldt-", (WORDD, 20, 20)), "deploy"),
    ("GitLab", "gitlab-feed-token", ("glft-", (WORDD, 20, 20)), "feed"),
    ("GitLab", "gitlab-feature-flag-client-token", ("glffct-", (WORDD, 20, 20)), "unleash"),
    ("GitLab", "gitlab-incoming-mail-token", ("glimt-", (WORDD, 25, 25)), "incoming"),
    ("GitLab", "gitlab-kubernetes-agent-token", ("glagent-", (WORDD, 50, 50)), "agent"),
    ("GitLab", "gitlab-oauth-app-secret", ("gloas-", (WORDD, 64, 64)), "oauth_app"),
    ("GitLab", "gitlab-ptt", ("glptt-", (HEX, 40, 40)), "trigger"),
    ("GitLab", "gitlab-rrt", ("GR1348941", (WORDD, 20, 20)), "registration"),
    ("GitLab", "gitlab-runner-authentication-token", ("glrt-", (WORDD, 20, 20)), "runner"),
    ("GitLab", "gitlab-runner-authentication-token-routable",
     ("glrt-t", ("123", 1, 1), "_", (WORDD, 27, 60), ".", (LOWNUM, 2, 2), (LOWNUM, 7, 7)),
     "runner"),
    ("GitLab", "gitlab-scim-token", ("glsoat-", (WORDD, 20, 20)), "scim"),
    ("GitLab", "gitlab-cicd-job-token", ("glcbt-", (ALNUM, 1, 5), "_", (WORDD, 20, 20)),
     "CI_JOB_TOKEN"),
    ("Hugging Face", "huggingface-access-token", ("hf_", (string.ascii_letters, 34, 34)),
     "HF_TOKEN"),
    ("npm", "npm-access-token", ("npm_", (ALNUM, 36, 36)), "NPM_TOKEN"),
    ("PyPI", "pypi-upload-token", ("pypi-AgEIcHlwaS5vcmc", (WORDD, 50, 200)), "password"),
    ("SendGrid", "sendgrid-api-token", ("SG.", (WORDD, 22, 22), ".", (WORDD, 43, 43)),
     "SENDGRID_API_KEY"),
    ("Telegram", "telegram-bot-api-token", ((string.digits, 5, 16), ":A", (WORDD, 34, 34)),
     "TELEGRAM_BOT_TOKEN"),
    ("Stripe", "stripe-access-token", ("sk_live_", (ALNUM, 24, 99)), "STRIPE_SECRET_KEY"),
    ("Stripe", "stripe-access-token", ("rk_test_", (ALNUM, 24, 99)), "stripe_restricted"),
    ("Stripe", "stripe-access-token", ("sk_prod_", (ALNUM, 24, 99)), "stripe"),
    ("Slack", "slack-bot-token", ("xoxb-", (string.digits, 10, 13), "-",
                                  (string.digits, 10, 13), "-", (ALNUM, 24, 24)), "SLACK_BOT"),
    ("Slack", "slack-user-token", ("xoxp-", (string.digits, 10, 13), "-",
                                   (string.digits, 10, 13), "-", (string.digits, 10, 13), "-",
                                   (ALNUM, 28, 34)), "SLACK_USER"),
    ("Slack", "slack-legacy-workspace-token", ("xoxa-2-", (ALNUM, 8, 48)), "slack_ws"),
    ("Slack", "slack-legacy-token", ("xoxs-", (string.digits, 8, 12), "-",
                                     (string.digits, 8, 12), "-", (string.digits, 8, 12), "-",
                                     (HEX, 64, 64)), "slack_legacy"),
    ("Slack", "slack-app-token", ("xapp-1-A", (UPNUM, 10, 10), "-", (string.digits, 13, 13),
                                  "-", (HEX, 64, 64)), "SLACK_APP_TOKEN"),
    ("Slack", "slack-config-access-token", ("xoxe.xoxp-1-", (UPNUM, 163, 166)),
     "slack_config"),
    ("Slack", "slack-config-refresh-token", ("xoxe-1-", (UPNUM, 146, 146)), "slack_refresh"),
    ("Slack", "slack-webhook-url", ("https://hooks.slack.com/services/T", (UPNUM, 8, 10),
                                    "/B", (UPNUM, 8, 10), "/", (ALNUM, 24, 24)),
     "SLACK_WEBHOOK"),
    ("Google", "gcp-api-key", ("AIza", (WORDD, 35, 35)), "GOOGLE_API_KEY"),
    ("Shopify", "shopify-access-token", ("shpat_", (HEXU, 32, 32)), "SHOPIFY_TOKEN"),
    ("Shopify", "shopify-custom-access-token", ("shpca_", (HEXU, 32, 32)), "shopify_custom"),
    ("Shopify", "shopify-private-app-access-token", ("shppa_", (HEXU, 32, 32)), "shopify"),
    ("Shopify", "shopify-shared-secret", ("shpss_", (HEXU, 32, 32)), "shopify_shared"),
    ("Twilio", "twilio-api-key", ("SK", (HEXU, 32, 32)), "TWILIO_API_KEY"),
    ("Mailgun", "mailgun-private-api-token", ("key-", (HEX, 32, 32)), "MAILGUN_API_KEY"),
    ("Mailchimp", "mailchimp-api-key", ((HEX, 32, 32), "-us", (string.digits, 2, 2)),
     "MAILCHIMP_API_KEY"),
    ("Square", "square-access-token", ("EAAA", (WORDD, 22, 60)), "SQUARE_ACCESS_TOKEN"),
    ("Square", "square-access-token", ("sq0atp-", (WORDD, 22, 60)), "square"),
    ("DigitalOcean", "digitalocean-pat", ("dop_v1_", (HEX, 64, 64)), "DIGITALOCEAN_TOKEN"),
    ("DigitalOcean", "digitalocean-access-token", ("doo_v1_", (HEX, 64, 64)), "do_oauth"),
    ("DigitalOcean", "digitalocean-refresh-token", ("dor_v1_", (HEX, 64, 64)), "do_refresh"),
    ("Doppler", "doppler-api-token", ("dp.pt.", (ALNUM, 43, 43)), "DOPPLER_TOKEN"),
    ("Databricks", "databricks-api-token", ("dapi", (HEX, 32, 32)), "DATABRICKS_TOKEN"),
    ("Linear", "linear-api-key", ("lin_api_", (ALNUM, 40, 40)), "LINEAR_API_KEY"),
    ("Postman", "postman-api-token", ("PMAK-", (HEX, 24, 24), "-", (HEX, 34, 34)),
     "POSTMAN_API_KEY"),
    ("New Relic", "new-relic-user-api-key", ("NRAK-", (ALNUM, 27, 27)), "NEW_RELIC_API_KEY"),
    ("Grafana", "grafana-cloud-api-token", ("glc_", (B64, 32, 120)), "GRAFANA_TOKEN"),
    ("Grafana", "grafana-service-account-token", ("glsa_", (ALNUM, 32, 32), "_", (HEX, 8, 8)),
     "grafana_sa"),
    ("Grafana", "grafana-api-key", ("eyJrIjoi", (ALNUM, 70, 120)), "grafana_api_key"),
    ("PlanetScale", "planetscale-api-token", ("pscale_tkn_", (WORDD + "=.", 32, 64)),
     "PLANETSCALE_TOKEN"),
    ("PlanetScale", "planetscale-password", ("pscale_pw_", (WORDD + "=.", 32, 64)), "pscale"),
    ("PlanetScale", "planetscale-oauth-token", ("pscale_oauth_", (WORDD + "=.", 32, 64)),
     "pscale_oauth"),
    ("Pulumi", "pulumi-api-token", ("pul-", (HEX, 40, 40)), "PULUMI_ACCESS_TOKEN"),
    ("Sentry", "sentry-user-token", ("sntryu_", (HEX, 64, 64)), "SENTRY_AUTH_TOKEN"),
    ("Vault", "vault-service-token", ("hvs.", (WORDD, 90, 120)), "VAULT_TOKEN"),
    ("Vault", "vault-batch-token", ("hvb.", (WORDD, 138, 300)), "vault_batch"),
    ("age", "age-secret-key", ("AGE-SECRET-KEY-1", (BECH32, 58, 58)), "age_identity"),
    ("Alibaba", "alibaba-access-key-id", ("LTAI", (ALNUM, 20, 20)), "ALIBABA_ACCESS_KEY_ID"),
    ("Atlassian", "atlassian-api-token", ("ATATT3", (WORDD + "=", 186, 186)), "JIRA_TOKEN"),
    ("Dynatrace", "dynatrace-api-token", ("dt0c01.", (ALNUM, 24, 24), ".", (ALNUM, 64, 64)),
     "DT_API_TOKEN"),
    ("Flutterwave", "flutterwave-secret-key", ("FLWSECK_TEST-", ("abcdefgh0123456789", 32, 32),
                                               "-X"), "FLW_SECRET_KEY"),
    ("Flutterwave", "flutterwave-encryption-key", ("FLWSECK_TEST-",
                                                   ("abcdefgh0123456789", 12, 12)),
     "FLW_ENCRYPTION_KEY"),
    ("RubyGems", "rubygems-api-token", ("rubygems_", (HEX, 48, 48)), "GEM_HOST_API_KEY"),
    ("Prefect", "prefect-api-token", ("pnu_", (ALNUM, 36, 36)), "PREFECT_API_KEY"),
    ("Shippo", "shippo-api-token", ("shippo_live_", (HEXU, 40, 40)), "SHIPPO_TOKEN"),
    ("Notion", "notion-api-token", ("ntn_", (string.digits, 11, 11), (ALNUM, 35, 35)),
     "NOTION_TOKEN"),
    ("Airtable", "airtable-personnal-access-token", ("pat", (ALNUM, 14, 14), ".",
                                                     (HEX, 64, 64)), "AIRTABLE_PAT"),
]


def _part(rng: random.Random, part: Part) -> str:
    if isinstance(part, str):
        return part
    chars, lo, hi = part
    body = "".join(rng.choice(chars) for _ in range(rng.randint(lo, hi)))
    return body


def key_value(rng: random.Random, parts: tuple[Part, ...]) -> str:
    return "".join(_part(rng, p) for p in parts)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(rng: random.Random, fake: Faker) -> str:
    header = {"alg": rng.choice(["HS256", "RS256", "ES256"]), "typ": "JWT"}
    payload = {"sub": fake.uuid4(), "name": fake.name(), "iat": fake.unix_time()}
    sig = bytes(rng.randrange(256) for _ in range(rng.choice([32, 64])))
    return ".".join((_b64url(json.dumps(header).encode()),
                     _b64url(json.dumps(payload).encode()), _b64url(sig)))


def steuer_id(rng: random.Random) -> str:
    """A German tax id by its published rules: 11 digits, the first not 0, exactly one of the
    first ten digits twice, the last an ISO 7064 MOD 11,10 check digit."""
    while True:
        digits = rng.sample(range(10), 9)
        if digits[0] == 0:
            continue
        digits.insert(rng.randrange(1, 10), rng.choice(digits))
        product = 10
        for d in digits:
            total = (d + product) % 10 or 10
            product = total * 2 % 11
        check = (11 - product) % 10
        return "".join(map(str, digits)) + str(check)


def phone_rows(per_locale: int, seed: int) -> list[tuple[str, str, bool]]:
    """(kind, value, claimed) of Faker's phone numbers, without and with an extension."""
    rng = random.Random(seed)
    out: list[tuple[str, str, bool]] = []
    for locale in PHONE_LOCALES:
        fake = Faker(locale)
        fake.seed_instance(seed)
        numbers = list(dict.fromkeys(fake.phone_number() for _ in range(per_locale * 20)))
        with_x = [n for n in numbers if "x" in n][:per_locale]
        plain = [n for n in numbers if "x" not in n][:per_locale]
        kind = "CN_MOBILE" if locale == "zh_CN" else "PHONE_NUMBER"
        for n in plain:
            claimed = locale in PHONE_CLAIMED_LOCAL or n.startswith("+")
            out.append((kind, n, claimed))
            if len(with_x) < per_locale:  # the locale writes no extensions: add one
                ext = rng.choice((f"x{rng.randint(10, 99999)}", f" ext. {rng.randint(2, 999)}"))
                out.append(("PHONE_NUMBER", n + ext, claimed))
        out += [("PHONE_NUMBER", n, True) for n in with_x]  # en_US: +1, 001- or NANP
    return out


def id_values(per_kind: int, seed: int) -> list[tuple[str, str, str]]:
    """(kind, value, label) of the national IDs, IBANs and US SSNs."""
    rng = random.Random(seed)
    out: list[tuple[str, str, str]] = []
    for kind, (labels, locale, make) in ID_SOURCES.items():
        fake = Faker(locale)
        fake.seed_instance(seed)
        out += [(kind, str(make(fake)), labels[i % len(labels)]) for i in range(per_kind)]
    labels = ("Steuer-ID", "steuerliche Identifikationsnummer", "IdNr")
    out += [("DE_TAX_ID", steuer_id(rng), labels[i % 3]) for i in range(per_kind)]
    for i in range(per_kind):
        fake = Faker(IBAN_LOCALES[i % len(IBAN_LOCALES)])
        fake.seed_instance(seed + i)
        iban = fake.iban().lower()
        if i % 2:
            iban = " ".join(iban[j:j + 4] for j in range(0, len(iban), 4))
        out.append(("IBAN_CODE", iban, ("iban", "IBAN", "account")[i % 3]))
    return out


def key_values(per_rule: int, seed: int) -> list[tuple[str, str, str]]:
    """(provider, value, name) of provider keys after the gitleaks rules."""
    rng = random.Random(seed)
    fake = Faker("en_US")
    fake.seed_instance(seed)
    out = []
    for provider, rule, parts, name in KEY_RULES:
        out += [(f"{provider} ({rule})", key_value(rng, parts), name) for _ in range(per_rule)]
    out += [("JWT (jwt)", jwt(rng, fake), "id_token") for _ in range(per_rule)]
    return out


def email_values(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i, locale in enumerate(("en_US", "en_GB", "fr_FR", "it_IT", "de_DE") * count):
        if len(out) >= count:
            break
        fake = Faker(locale)
        fake.seed_instance(seed + i)
        user = "".join(c for c in fake.user_name() if (c.isascii() and c.isalnum()) or c in "._")
        domain = fake.free_email_domain() if i % 2 else fake.domain_name()
        if i % 3 == 0:
            cut = rng.randint(1, max(1, len(user) - 1))
            local = user[:cut] + "'" + user[cut:]
        elif i % 3 == 1:
            local = f"{user}+{''.join(c for c in fake.word() if c.isascii() and c.isalnum())}"
        else:
            last = "".join(c for c in fake.last_name().lower() if c.isascii() and c.isalpha())
            local = f"{last[:1]}'{last}+{rng.randint(1, 99)}"
        out.append(f"{local}@{domain}")
    return out


def negatives(seed: int, count: int) -> list[str]:
    """Hard negatives: text with nothing of a claimed kind."""
    rng = random.Random(seed)
    fake = Faker("en_US")
    fake.seed_instance(seed)
    makers: list[Callable[[], str]] = [
        lambda: f"request {fake.uuid4()} finished in {rng.randint(3, 900)} ms",
        lambda: f"commit {fake.sha1()} on main",
        lambda: f"sha256 digest {fake.sha256()}",
        lambda: f"md5 {fake.md5()}  ./dist/app.tar.gz",
        lambda: f"ISBN {fake.isbn13()} (paperback)",
        lambda: f"barcode {fake.ean13()} scanned at till 4",
        lambda: f"EAN-8 {fake.ean8()}",
        lambda: f"scheduled for {fake.iso8601()} UTC",
        lambda: f"on {fake.date()} at {fake.time()} the job restarted",
        lambda: f"timestamp={fake.unix_time():.0f}",
        lambda: f"upgrade to version {rng.randint(0, 20)}.{rng.randint(0, 40)}.{rng.randint(0, 99)}",
        lambda: f"User-Agent: {fake.user_agent()}",
        lambda: f"saved to {fake.file_path(depth=3)}",
        lambda: f"see {fake.url()}{fake.uri_path()}",
        lambda: f"total {fake.pricetag()} incl. VAT",
        lambda: f"location {fake.latitude()}, {fake.longitude()}",
        lambda: f"SKU {fake.bothify('??-####-??').upper()} out of stock",
        lambda: f"{fake.company()}: {fake.catch_phrase()}",
        lambda: f"ticket #{rng.randint(1000, 99999)} assigned to {fake.first_name()}",
        lambda: f"color {fake.hex_color()} and {fake.color_name()}",
        lambda: f"{fake.date_time().isoformat()} INFO worker-{rng.randint(1, 64)} "
                f"processed {rng.randint(1, 10 ** 6)} rows",
        lambda: f"build {fake.date_time().strftime('%Y%m%d')}.{rng.randint(1, 40)} passed",
        lambda: f"license plate {fake.license_plate()}",
        lambda: f"postcode {fake.postcode()}",
        lambda: f"npm i @{fake.word()}/{fake.word()}@{rng.randint(1, 9)}.{rng.randint(0, 9)}.0",
        lambda: f"git clone git@github.com:{fake.user_name()}/{fake.word()}.git",
        lambda: f"@{fake.user_name()} can you review this?",
        lambda: f"docker pull {fake.word()}:{rng.randint(1, 9)}.{rng.randint(0, 9)}@sha256:"
                f"{fake.sha256()}",
        lambda: f"Error 0x{rng.randint(0, 2 ** 32 - 1):08X} in module {fake.word()}.dll",
        lambda: f"  File \"{fake.file_path(extension='py')}\", line {rng.randint(1, 3000)}, "
                f"in {fake.word()}",
        lambda: f"pod {fake.word()}-{fake.hexify('^^^^^^^^^')}-{fake.lexify('?????')} restarted",
        lambda: f"api_key={rng.choice(['<your-api-key>', '${API_KEY}', 'YOUR_API_KEY', '***'])}",
        lambda: f"password: {rng.choice(['********', '<redacted>', '${DB_PASSWORD}', ''])}",
        lambda: f"export OPENAI_API_KEY={rng.choice(['sk-...', 'sk-your-key-here', '$KEY'])}",
        lambda: f"Authorization: Bearer {rng.choice(['<token>', '$TOKEN', '{{token}}'])}",
        lambda: f"{rng.randint(1, 28)}/{rng.randint(1, 12)}/{rng.randint(1990, 2030)} "
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}",
        lambda: f"elapsed {rng.random() * 1000:.3f}s, {rng.randint(1, 10 ** 5)} requests",
    ]
    out = [makers[i % len(makers)]() for i in range(count)]
    out += near_misses(seed, max(1, count // 10))
    return out


def _corrupt(rng: random.Random, value: str) -> str:
    """``value`` with its last digit (or letter) changed: a wrong check."""
    last = value[-1]
    pool = string.digits if last.isdigit() else string.ascii_uppercase
    return value[:-1] + rng.choice([c for c in pool if c != last])


def near_misses(seed: int, per_kind: int) -> list[str]:
    """Faker IDs with a wrong check digit, written without their name."""
    rng = random.Random(seed + 1)
    out = []
    for kind in ("FR_NIR", "IT_FISCAL_CODE", "BR_CPF", "ES_NIF", "ES_NIE"):
        _labels, locale, make = ID_SOURCES[kind]
        fake = Faker(locale)
        fake.seed_instance(seed)
        out += [f"ref {_corrupt(rng, str(make(fake)))} ok" for _ in range(per_kind)]
    fake = Faker("en_IN")
    fake.seed_instance(seed)
    for _ in range(per_kind):  # Faker's Aadhaar digit is a Luhn digit: make it a wrong one
        body = fake.aadhaar_id()[:11]
        right = next(d for d in string.digits if _verhoeff_ok(body + d))
        v = body + rng.choice([d for d in string.digits if d != right])
        out.append(f"ref {v[:4]} {v[4:8]} {v[8:]} ok")
    return out


def _verhoeff_ok(number: str) -> bool:
    """The Verhoeff check (dihedral group D5) of UIDAI's Aadhaar numbers."""
    def mul(a: int, b: int) -> int:  # D5: rotations 0-4, reflections 5-9
        if a < 5 and b < 5:
            return (a + b) % 5
        if a < 5:
            return 5 + (b - 5 + a) % 5
        if b < 5:
            return 5 + (a - 5 - b) % 5
        return (a - b) % 5
    perm = (1, 5, 7, 6, 2, 8, 3, 0, 9, 4)
    c = 0
    for i, ch in enumerate(reversed(number)):
        d = int(ch)
        for _ in range(i % 8):
            d = perm[d]
        c = mul(c, d)
    return c == 0


@dataclass
class Tally:
    gold: Counter[str] = field(default_factory=Counter)
    found: Counter[str] = field(default_factory=Counter)
    scope_gold: int = 0
    scope_found: int = 0
    neg: int = 0
    neg_flagged: int = 0
    errors: list[str] = field(default_factory=list)


def _fam(kind: str) -> str:
    return FAMILY.get(kind, kind)


def run(per_kind: int = 30, seed: int = 4040) -> Tally:
    redactor, key = Redactor(), b"k" * 32
    t = Tally()

    def check(label: str, kind: str, text: str, value: str, counted: bool = True) -> None:
        at = text.find(value)
        ents = redactor.redact(text, token_key=key).entities
        ok = any(_fam(e.kind) == _fam(kind) and e.start <= at and e.end >= at + len(value)
                 for e in ents)
        if not counted:
            t.scope_gold += 1
            t.scope_found += ok
            return
        t.gold[label] += 1
        t.found[label] += ok
        if not ok:
            t.errors.append(f"MISS {label}: {text!r} -> "
                            f"{[(e.kind, text[e.start:e.end]) for e in ents]}")

    for kind, value, claimed in phone_rows(per_kind, seed):
        for tpl in PHONE_TEMPLATES:
            check("PHONE_NUMBER", kind, tpl.format(v=value), value, claimed)
    for kind, value, label in id_values(per_kind, seed):
        for tpl in ID_TEMPLATES:
            check(kind, kind, tpl.format(label=label, v=value), value)
    for provider, value, name in key_values(max(1, per_kind // 6), seed):
        secret = value.split("hooks.slack.com/services/")[-1]
        for tpl in KEY_TEMPLATES:
            check(f"API_SECRET {provider}", "API_SECRET", tpl.format(name=name, v=value), secret)
    for value in email_values(per_kind * 2, seed):
        for tpl in MAIL_TEMPLATES:
            check("EMAIL_ADDRESS", "EMAIL_ADDRESS", tpl.format(v=value), value)
    for text in negatives(seed, per_kind * 20):
        t.neg += 1
        ents = redactor.redact(text, token_key=key).entities
        if ents:
            t.neg_flagged += 1
            t.errors.append(f"FP: {text!r} -> {[(e.kind, text[e.start:e.end]) for e in ents]}")
    return t


def summary(t: Tally) -> tuple[float, float]:
    found, gold = sum(t.found.values()), sum(t.gold.values())
    return found / gold, t.neg_flagged / max(1, t.neg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-kind", type=int, default=30)
    ap.add_argument("--seed", type=int, default=4040)
    ap.add_argument("--errors", action="store_true")
    args = ap.parse_args()
    t = run(args.per_kind, args.seed)
    kinds: Counter[str] = Counter()
    kinds_found: Counter[str] = Counter()
    for label, n in t.gold.items():
        kinds[label.split(" ")[0]] += n
        kinds_found[label.split(" ")[0]] += t.found[label]
    for kind in sorted(kinds):
        print(f"{kind:16}{kinds_found[kind]:>6}/{kinds[kind]:<6}"
              f"{kinds_found[kind] / kinds[kind]:.3f}")
    missed = sorted(label for label in t.gold if t.found[label] < t.gold[label])
    for label in missed:
        print(f"  {label}: {t.found[label]}/{t.gold[label]}")
    recall, fp = summary(t)
    print(f"{'ALL claimed':16}{sum(t.found.values()):>6}/{sum(t.gold.values()):<6}{recall:.4f} "
          f"(target >= {RECALL_TARGET})")
    print(f"phone numbers of unclaimed local formats (not counted): "
          f"{t.scope_found}/{t.scope_gold}")
    print(f"hard negatives with any detection: {t.neg_flagged}/{t.neg} = {fp:.2%} "
          f"(target <= {FP_TARGET:.0%})")
    if args.errors:
        print("\n".join(t.errors))
    return 0 if recall >= RECALL_TARGET and fp <= FP_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
