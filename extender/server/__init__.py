"""The HTTP side of the extender: engines (granian, gunicorn), authentication, the wire types of the
scheduler's extender protocol and the verbs' glue (decode -> one call over the ledger and policy -> encode)."""
