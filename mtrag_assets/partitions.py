import dagster as dg

# One partition per entry of sources.yaml; `mtrag build` and the sources sensor keep it in sync.
sources_partitions = dg.DynamicPartitionsDefinition(name="sources")
