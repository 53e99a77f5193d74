"""Recognizers of credentials: API keys and tokens of the common providers, labelled secrets,
and PEM private keys (:func:`private_key_spans`).

Each is a :class:`~.linear.LinearRecognizer`; knows nothing of the redactor.
"""

from __future__ import annotations

import re
from typing import Any

from presidio_analyzer import RecognizerResult

from .linear import API_SECRET, LinearRecognizer, Rx, Validator, rx

# --------------------------------------------------------------------------------------------
# API keys, tokens and private keys
# --------------------------------------------------------------------------------------------
_B64URL = "A-Za-z0-9_\\-"
_HAS_DIGIT = re.compile(r"[0-9]")
_HAS_ALPHA = re.compile(r"[A-Za-z]")
_HAS_UPPER = re.compile(r"[A-Z]")
_HAS_LOWER = re.compile(r"[a-z]")


def _random_looking(value: str) -> bool:
    """Random credentials mix letters and digits (or both cases); prose does not."""
    if _HAS_DIGIT.search(value) and _HAS_ALPHA.search(value):
        return True
    return bool(_HAS_UPPER.search(value) and _HAS_LOWER.search(value)
                and len(value) >= 24 and "-" not in value)


def _mixed(m: re.Match[str], view: str) -> float | None:
    body = m.group(0)
    if body.startswith("sk-"):
        body = body[3:]
    return 0.9 if _HAS_DIGIT.search(body) and _HAS_ALPHA.search(body) else None


def _prefixed(m: re.Match[str], view: str) -> float | None:
    """A provider's prefixed key: letters and digits, or (20 characters or more) both cases:
    one random key in a few hundred has no digit
    (``pscale_pw_NYt.zlyFT=FYdsMp_WYbGdJbqTUejGvxL``). Only after a provider's own prefix:
    unprefixed shapes (Discord's dotted tokens) still need a digit, as code identifiers of
    that shape have none."""
    body = m.group(0)
    if _mixed(m, view) is not None:
        return 0.9
    if len(body) >= 20 and _HAS_UPPER.search(body) and _HAS_LOWER.search(body):
        return 0.9
    return None


def _connection_password(m: re.Match[str], view: str) -> float | None:
    """A connection string's password: not an empty, templated or masked value."""
    value = m.group("v").strip("{} \t")
    if not value or value.startswith(("$", "%", "<")) or set(value) <= set("*x?."):
        return None
    return 0.85


def _mixed_group(score: float) -> Validator:
    def validate(m: re.Match[str], view: str) -> float | None:
        return score if _random_looking(m.group("v")) else None
    return validate


_LABEL_WORDS = ("secret_?access_?key", "aws_?access_?key", "aws[a-z_]{0,12}_?key",
                "aws_?secret(?:_?access)?_?key", "client_?secret",
                "api_?secret", "secret_?key", "private_?key", "api_?key", "access_?token",
                "auth_?token", "refresh_?token", "pass" + "word", "passwd", "secret", "token")
_SECRET_LABEL = "(?:" + "|".join(_LABEL_WORDS) + ")"
def _atomic(name: str, body: str) -> str:
    """``body`` matched as an atomic group (no backtracking into it), as group ``name``:
    Python < 3.11 has no possessive quantifiers; a captured look-ahead is equivalent."""
    return f"(?=(?P<{name}_>{body}))(?P<{name}>(?P={name}_))"


_SECRET_PATTERNS: tuple[Rx, ...] = (
    # OpenAI (sk-..., sk-proj-..., sk-svcacct-...), Anthropic (sk-ant-...), and similar.
    rx("openai_style", rf"(?<![{_B64URL}])sk-[{_B64URL}]{{20,}}(?![{_B64URL}])", 0.9, _mixed,
       needles=("sk-",)),
    # Stripe live/test secret and restricted keys.
    rx("stripe", r"(?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{16,}"
       r"(?![A-Za-z0-9_])",
       0.95, needles=("sk_", "rk_")),
    # AWS access key ids (long-term AKIA, temporary ASIA).
    rx("aws_access_key_id", r"(?<![A-Za-z0-9])(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|"
       r"AIPA|ANPA|ANVA)[A-Z0-9]{16}(?![A-Za-z0-9])", 0.95,
       needles=("A3T", "AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA",
                "ANVA")),
    # A 40-character AWS secret access key (or any labelled secret) after its label:
    # "aws_secret_access_key = …", "SecretAccessKey": "…", "aws configure set
    # aws_secret_access_key …", "password: …". The label and separator are bounded.
    rx("aws_secret_labelled",
       rf"(?i:{_SECRET_LABEL})[\"']?[ \t]{{0,4}}(?:[:=]|=>|[ \t])[ \t]{{0,4}}[\"']?"
       r"(?P<v>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])", 0.95, _mixed_group(0.95), "v",
       needles=("key", "secret"), fold_case=True),
    rx("labelled_secret",
       rf"(?i:{_SECRET_LABEL})[\"']?[ \t]{{0,4}}(?:[:=]|=>)[ \t]{{0,4}}[\"']?"
       + _atomic("v", r"[A-Za-z0-9_\-+/=.~!@#$%^&*]{8,200}")
       + r"(?![A-Za-z0-9_\-+/=.~!@#$%^&*])", 0.7, _mixed_group(0.7), "v",
       needles=("secret", "key", "token", "passw"), fold_case=True),
    # GitHub classic tokens and fine-grained PATs.
    rx("github_token", r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{36,251}(?![A-Za-z0-9_])", 0.95,
       needles=("gh",)),
    rx("github_pat", r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{22,255}(?![A-Za-z0-9_])", 0.95,
       needles=("github_pat_",)),
    # GitLab personal/project/group tokens and friends.
    # routable tokens end in "." and nine base-36 characters (gitleaks' -routable rules)
    rx("gitlab_token", r"(?<![A-Za-z0-9_\-])gl(?:pat|dt|ptt|rt|cbt|oas|soat|ft|ffct|imt|agent)-"
       r"[A-Za-z0-9_\-]{20,300}(?:\.[0-9a-z]{9})?(?![A-Za-z0-9_\-])", 0.95, needles=("gl",)),
    rx("gitlab_runner", r"(?<![A-Za-z0-9_\-])GR1348941[A-Za-z0-9_\-]{20,64}(?![A-Za-z0-9_\-])",
       0.95, needles=("GR1348941",)),
    # npm: the token in an .npmrc "_authToken=" line (whatever its shape)
    rx("npmrc_token", r":_authToken=[ \t]{0,2}(?P<v>[^\s\"'$][^\s\"']{6,200})", 0.9, None, "v",
       needles=("_authToken",)),
    # Discord bot tokens: base64(user id).timestamp.hmac
    rx("discord_bot", r"(?<![A-Za-z0-9_\-])[A-Za-z0-9_\-]{23,28}\.[A-Za-z0-9_\-]{6,7}\."
       r"[A-Za-z0-9_\-]{27,40}(?![A-Za-z0-9_\-])", 0.85, _mixed),
    # PyPI upload tokens (macaroons)
    rx("pypi_token", r"(?<![A-Za-z0-9_\-])pypi-AgE[A-Za-z0-9_\-]{50,}", 0.95, needles=("pypi-",)),
    # Hugging Face access tokens.
    rx("huggingface", r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,40}(?![A-Za-z0-9_])", 0.9,
       needles=("hf_",)),
    # npm access tokens.
    rx("npm_token", r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9_])", 0.95,
       needles=("npm_",)),
    # SendGrid API keys.
    rx("sendgrid", r"(?<![A-Za-z0-9_\-])SG\.[A-Za-z0-9_\-]{16,32}\.[A-Za-z0-9_\-]{16,64}"
       r"(?![A-Za-z0-9_\-])", 0.95, needles=("SG.",)),
    # Telegram bot tokens: bot id, colon, 35-character secret (both halves are the secret).
    rx("telegram_bot", r"(?<![A-Za-z0-9_:])[0-9]{5,16}:A[A-Za-z0-9_\-]{34}(?![A-Za-z0-9_\-])",
       0.95, _prefixed, needles=(":A",)),
    # Azure storage account keys and connection strings' secrets.
    rx("azure_account_key", r"(?i:AccountKey|SharedAccessKey|AccessKey)=(?P<v>[A-Za-z0-9+/]"
       r"{20,100}={0,2})", 0.95, None, "v", needles=("accesskey", "accountkey"), fold_case=True),
    rx("azure_sas_sig", r"(?<![A-Za-z0-9])sig=(?P<v>[A-Za-z0-9%+/]{30,100}(?:%3D|=){0,2})",
       0.9, None, "v", needles=("sig=",)),
    # Slack tokens.
    rx("slack_token", r"(?<![A-Za-z0-9\-])(?:xoxe\.)?xox[abposre]-[A-Za-z0-9\-]{10,}"
       r"(?![A-Za-z0-9\-])", 0.9, needles=("xox",)),
    rx("slack_app_token", r"(?<![A-Za-z0-9\-])xapp-[0-9]-[A-Z0-9]{6,}-[0-9]{6,}-[a-z0-9]{16,}"
       r"(?![A-Za-z0-9\-])", 0.95, needles=("xapp-",)),
    rx("slack_webhook", r"hooks\.slack\.com/services/(?P<v>T[A-Za-z0-9_]{6,}/B[A-Za-z0-9_]{6,}/"
       r"[A-Za-z0-9_]{16,})", 0.95, None, "v", needles=("hooks.slack.com",)),
    # Google API keys.
    rx("google_api_key", r"(?<![A-Za-z0-9_\-])AIza[0-9A-Za-z_\-]{35}(?![A-Za-z0-9_\-])", 0.9,
       needles=("AIza",)),
    # JSON Web Tokens: header.payload[.signature]; header and payload are base64url JSON.
    rx("jwt", rf"(?<![.{_B64URL}])eyJ[{_B64URL}]{{5,}}\.eyJ[{_B64URL}]{{5,}}"
       rf"(?:\.[{_B64URL}]*)?(?![{_B64URL}])", 0.95, needles=("eyJ",)),
    # The credential after an HTTP "Bearer"/"Basic"/"token" scheme (the word itself is kept).
    rx("bearer", r"(?<![A-Za-z])(?:Bearer|bearer|BEARER|Basic|token|Token)[ \t]{1,4}"
       r"(?P<v>[A-Za-z0-9._~+/\-]{16,}=*)(?![A-Za-z0-9._~+/=\-])", 0.85, _mixed_group(0.85),
       "v", needles=("bearer", "basic", "token"), fold_case=True),
    # The password of a connection string (ODBC, ADO.NET, JDBC properties):
    # "...;Uid=sa;Pwd=Winter2024!;", "Password=hunter2;", "PWD={with;braces}" -- the value
    # right after "=", up to the next ";", quote, "&" or space.
    rx("connection_password", r"(?<![A-Za-z0-9_])(?i:pwd|password|passwd)="
       r"(?P<v>\{[^}\r\n]{1,128}\}|[^\s;\"'{}&][^\s;\"'&]{0,127})", 0.85,
       _connection_password, "v", needles=("pwd=", "passw"), fold_case=True),
    # Prefixed keys of common providers (shapes as in public rule sets such as gitleaks').
    rx("provider_prefixed", r"(?<![A-Za-z0-9_\-])(?:"
       r"shp(?:at|ca|pa|ss|ua)_[a-fA-F0-9]{32}"            # Shopify
       r"|SK[0-9a-fA-F]{32}"                                # Twilio API key
       r"|key-[0-9a-zA-Z]{32}"                              # Mailgun
       r"|[0-9a-f]{32}-us[0-9]{1,2}"                        # Mailchimp
       r"|sq0(?:atp|csp)-[0-9A-Za-z_\-]{22,60}"             # Square
       r"|EAAA[0-9A-Za-z_\-]{22,60}"                        # Square access token
       r"|do[opr]_v1_[a-f0-9]{64}"                          # DigitalOcean
       r"|dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,44}"  # Doppler
       r"|dapi[a-f0-9]{32}(?:-[0-9])?"                      # Databricks
       r"|lin_api_[A-Za-z0-9]{40}"                          # Linear
       r"|PMAK-[a-fA-F0-9]{24}-[a-fA-F0-9]{34}"             # Postman
       r"|NRAK-[A-Za-z0-9]{27}"                             # New Relic user key
       r"|gl(?:c|sa)_[A-Za-z0-9_+/]{32,400}={0,2}"          # Grafana
       r"|eyJrIjoi[A-Za-z0-9]{70,400}={0,3}"                # Grafana API key (older)
       r"|pscale_(?:tkn|pw|oauth)_[A-Za-z0-9=\-_.]{32,64}"   # PlanetScale
       r"|pul-[a-f0-9]{40}"                                 # Pulumi
       r"|sntry[su]_[A-Za-z0-9_+/=]{40,}"                   # Sentry (user, org tokens)
       r"|hv[sb]\.[A-Za-z0-9_\-]{24,}"                      # HashiCorp Vault
       r"|AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"  # age
       r"|LTAI[A-Za-z0-9]{20}"                              # Alibaba Cloud
       r"|ATATT3[A-Za-z0-9_\-=]{186}"                       # Atlassian
       r"|dt0c01\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}"          # Dynatrace
       r"|FLWSECK(?:_TEST)?-(?:[a-hA-H0-9]{32}-X|[a-hA-H0-9]{12})"  # Flutterwave
       r"|rubygems_[a-f0-9]{48}"                            # RubyGems
       r"|pnu_[A-Za-z0-9]{36}"                              # Prefect
       r"|shippo_(?:live|test)_[a-fA-F0-9]{40}"             # Shippo
       r"|ntn_[0-9]{11}[A-Za-z0-9]{35}"                     # Notion
       r"|secret_[A-Za-z0-9]{43}"                           # Notion (older)
       r"|pat[A-Za-z0-9]{14}\.[a-f0-9]{64}"                  # Airtable
       r"|xai-[A-Za-z0-9]{80}"                              # xAI
       r"|gsk_[A-Za-z0-9]{52}"                              # Groq
       r"|r8_[A-Za-z0-9]{37}"                               # Replicate
       r"|(?:sk|pk)_(?:live|test)_[A-Za-z0-9]{24,99}"       # Stripe-style (Clerk, Paystack)
       r")(?![A-Za-z0-9_\-])", 0.9, _prefixed, needles=(
           "shp", "SK", "key-", "-us", "sq0", "EAAA", "_v1_", "dp.", "dapi", "lin_api_", "eyJrIjoi",
           "PMAK-", "NRAK-", "glc_", "glsa_", "pscale_", "pul-", "sntr", "hvs.", "hvb.",
           "AGE-SECRET", "LTAI", "ATATT3", "dt0c01.", "FLWSECK", "rubygems_", "pnu_",
           "shippo_", "ntn_", "secret_", "pat", "xai-", "gsk_", "r8_", "k_live_", "k_test_")),
    # The password in a URL's user-info: scheme://user:password@host
    rx("url_password", r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{1,20}://"
       r"[A-Za-z0-9._%~!$&'()*+,;=\-]{0,64}:(?P<v>[^\s:/@]{1,128})@", 0.9, None, "v",
       needles=("://",)),
)
_PEM_BEGIN = re.compile(r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_BODY = re.compile(r"(?:(?:\r?\n|\\r|\\n|[ \t])+[A-Za-z0-9+/=:\-,]{16,})*")
_PEM_MAX = 32_768


class ApiSecretRecognizer(LinearRecognizer):
    """API keys, access tokens, JWTs, labelled secrets, URL passwords and private keys.

    Private-key blocks are paired in one linear pass (each BEGIN with the first END after
    it); a header without an END takes the base64 lines that follow it."""

    ENTITY = API_SECRET
    PATTERNS = _SECRET_PATTERNS

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        results = super().analyze(text, entities, nlp_artifacts, regex_flags)
        results.extend(RecognizerResult(self.ENTITY, s, e, score)
                       for s, e, score in private_key_spans(text))
        return results


def private_key_spans(text: str) -> list[tuple[int, int, float]]:
    """(start, end, score) of private-key blocks: each BEGIN paired with the first END after
    it (at most ``_PEM_MAX`` characters on), else the header plus the base64 lines after it
    (bounded the same way). Linear: one pass for the ENDs, one for the BEGINs."""
    if "-----BEGIN" not in text:
        return []
    import bisect

    ends = [m.end() for m in _PEM_END.finditer(text)]
    out: list[tuple[int, int, float]] = []
    for m in _PEM_BEGIN.finditer(text):
        i = bisect.bisect_left(ends, m.end())
        if i < len(ends) and ends[i] - m.start() <= _PEM_MAX:
            out.append((m.start(), ends[i], 1.0))
        else:
            body = _PEM_BODY.match(text, m.end(), m.end() + _PEM_MAX)
            out.append((m.start(), body.end() if body is not None else m.end(), 0.99))
    return out
