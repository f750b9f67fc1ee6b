"""Fixtures shared by the adversarial suite: the test PKI of the mTLS tests (server CA, the scheduler's CA
and a rogue one), made once per session."""

from tests.adversarial.test_net_mtls import pki  # noqa: F401  (the fixture, for test_net_scheduler.py too)
