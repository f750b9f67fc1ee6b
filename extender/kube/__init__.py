"""The only code that talks to the Kubernetes API: pod and node watches, Bindings, events, evictions,
and the in-memory stand-in of local mode (`deepres serve --no-kube`)."""
