"""mtrag's Dagster code location: one module per asset, thin wrappers over mtrag_resources."""
