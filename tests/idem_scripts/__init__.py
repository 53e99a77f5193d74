"""Helper scripts and shared scenario code for the idempotency tests (run as subprocesses)."""
