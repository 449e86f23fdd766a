"""mtrag's Dagster-free core. Layers, top to bottom (each imports only those below it; enforced by
.importlinter): `serving` | `stages`, `publish`, `stores`, `embedding` | `ingest`, `core`. It never
imports dagster or mtrag_assets; the application (Dagster definitions, runner, CLI) sits on it."""
