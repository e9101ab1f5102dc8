"""Security: redaction, access denied, names, TLS."""
