"""The application room: what a person or a service runs (the `mtrag` CLI, the build server and
its client, `mtrag watch`, the demo, the `dagster dev` wrapper, shadow builds and comparisons),
above the Dagster definitions in `mtrag_assets`, which never import it (.importlinter)."""
