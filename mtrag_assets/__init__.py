"""The application: mtrag's Dagster code location (one thin module per asset over
mtrag_resources, checks, partitions, schedules, sensors, resources), the build runner, the `mtrag`
CLI and the demo. The only package that imports dagster."""
