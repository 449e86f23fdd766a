"""The generation protocol in one place: the views of each store's markers and counts, the gate's
checks, manifests and the atomic CURRENT, the query gate, the golden-query quality gate (the file
and the verdict), and the build state (what changed, who builds, what a failed build left dirty).
Imports `stores` and below."""
