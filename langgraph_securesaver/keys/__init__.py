"""Key handling: key material as a type, master keys and key providers, and
field-level encryption under per-tenant data keys.

- :mod:`.material` -- ``SecretBytes`` and friends: key material whose repr reveals nothing.
- :mod:`.keyring` / :mod:`.keyring_file` -- master keys (``Keyring``) and keyring files on
  disk; :mod:`.provider` -- the ``KeyProvider`` protocol, ``WrappedKey`` and ``NoKeys``.
- :mod:`.aws_kms`, :mod:`.pkcs11_provider` -- providers whose master keys never leave AWS KMS
  or a PKCS#11 token; :mod:`.urls` names them by URL. The PKCS#11 provider's parts:
  :mod:`.pkcs11_pool` (PIN and session pool), :mod:`.pkcs11_url` (``pkcs11://`` URLs),
  :mod:`.pkcs11_errors` (how a failed call is classified).
- :mod:`.crypto` -- AES-GCM sealing, ``KeyManager`` and ``TenantKeys``; :mod:`.tokens` --
  the token format, associated data and key rows.

:mod:`.tokens`, :mod:`.provider` and :mod:`.material` import no ``cryptography``: the registry
and the audit name keys through them and start without it.

May import: the foundation modules (``errors``, ``textsafety``, ``tenancy`` ...) only; the
registry, the storage, the saver and the operations import this package, never the reverse.
"""
