"""Schemathesis hooks for scripts/contract.

A client certificate (`tls` of a client) is data no schema can state: its key must be the
certificate's own and it must not have expired, which no pattern says. So a request
schemathesis means to be valid gets a real certificate and key in place of the strings it
generated (made by scripts/contract with openssl); requests meant to be invalid are left as
they are, so a bad `tls` is still sent and must still be refused.
"""

import os

import schemathesis

CERT = open(os.environ["CONTRACT_TLS_CERT"]).read()
KEY = open(os.environ["CONTRACT_TLS_KEY"]).read()


def _meant_valid(case):
    meta = case.meta
    return meta is None or meta.generation.mode.is_positive


@schemathesis.hook
def before_call(ctx, case, **kwargs):
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
