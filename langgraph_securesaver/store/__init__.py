"""SecureStore: LangGraph's long-term memory store with SecureSaver's protection (sealed
values bound to their place, tenant-prefixed namespaces, redaction, blind-index filters,
sealed embeddings). See docs/store.md.

May import: the saver and everything below it; :mod:`..server` and :mod:`..cli` import this
package, never the reverse."""

from .secure import SecureStore, asecure_pair, secure_pair

__all__ = ["SecureStore", "asecure_pair", "secure_pair"]
