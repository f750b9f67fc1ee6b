"""The former home of the cluster state: it is `extender.ledger.Ledger` now (one ledger, one lock).
Kept so imports of `extender.state` keep working."""

from extender.ledger import ACCEPTED, OLD_SEQUENCE, UNKNOWN_NODE, Ledger, NodeTelemetry, Reserved

ClusterState = Ledger

__all__ = ["ACCEPTED", "OLD_SEQUENCE", "UNKNOWN_NODE", "ClusterState", "Ledger", "NodeTelemetry", "Reserved"]
