"""SecureStore: LangGraph's long-term memory store with SecureSaver's protection (sealed
values bound to their place, tenant-prefixed namespaces, redaction, blind-index filters,
sealed embeddings). See docs/store.md."""

from .secure import SecureStore, asecure_pair, secure_pair

__all__ = ["SecureStore", "asecure_pair", "secure_pair"]
