"""deepres extender: kube-scheduler extender webhook, cluster GPU state, DeepRes policies, node agent."""

__version__ = "0.1.0"
