"""Test doubles for the node agent: a fake /proc tree. The pynvml-shaped fake itself lives in
`extender.agent.fakenvml` so `deepres bench agent` can use it too (it is never a `--source`)."""
