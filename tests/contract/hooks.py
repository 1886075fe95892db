"""Schemathesis hooks for scripts/contract.

A client certificate (`tls` of a client) is data no schema can state: its key must be the
certificate's own and it must not have expired, which no pattern says. So a request
schemathesis means to be valid gets a real certificate and key in place of the strings it
generated (made by scripts/contract with openssl); requests meant to be invalid are left as
they are, so a bad `tls` is still sent and must still be refused.

An `Idempotency-Key` schemathesis generates is often the same short string for unrelated
requests. A repeat of a create gets its first answer, as documented, even after the
resource it made was deleted; the stateful phase then reads that replayed 201 as a new
creation, and the 404 of the deleted resource's link as "created resource not found". A
sender uses a fresh key per request, so a request meant to be valid gets a key of its own
here; a malformed key is sent as generated and must still be refused. Replays under one
key have their own tests (crates/cli/tests/it/idempotency.rs).
"""

import os
import uuid

import schemathesis

CERT = open(os.environ["CONTRACT_TLS_CERT"]).read()
KEY = open(os.environ["CONTRACT_TLS_KEY"]).read()


def _meant_valid(case):
    meta = case.meta
    return meta is None or meta.generation.mode.is_positive


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    headers = case.headers or {}
    if _meant_valid(case):
        for name in list(headers):
            if name.lower() == "idempotency-key":
                headers[name] = uuid.uuid4().hex
    body = case.body
    if not isinstance(body, dict) or not _meant_valid(case):
        return
    tls = body.get("tls")
    if not isinstance(tls, dict):
        return
    if isinstance(tls.get("client_cert_pem"), str) and isinstance(tls.get("client_key_pem"), str):
        tls["client_cert_pem"] = CERT
        tls["client_key_pem"] = KEY
        if isinstance(tls.get("ca_pem"), str):
            tls["ca_pem"] = CERT
