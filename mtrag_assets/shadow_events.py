"""Shadow generations in the Dagster UI (docs/shadow.md#in-the-dagster-ui): what the shadow
commands did, recorded in the live home's instance as runless events of assets declared here.

- `shadow_generation`, partitioned by profile: a shadow's published generation, with the
  profile's settings, after `mtrag build --profile NAME`;
- `shadow_comparison`, partitioned by profile: `mtrag compare live NAME`'s summary figures (plotted
  across comparisons) and its table of queries;
- `index_manifest`: a cut-over or a rollback publishes a live generation, so it is a
  materialization of the live manifest like a build's, tagged `mtrag/cutover` or `mtrag/rollback`.

A shadow's own stage runs live in the shadow's instance (`shadows/NAME/dagster_home`), never in
the live one: their materializations of the live asset keys would read as the live index's."""
from __future__ import annotations

import dagster as dg

from mtrag_resources.core.config import Settings

PROFILES = dg.DynamicPartitionsDefinition(name="profiles")
RECORD_VERSION = "1"  # what the records' metadata holds: raised when it changes

shadow_generation = dg.AssetSpec(
    "shadow_generation", partitions_def=PROFILES, group_name="shadow", deps=["index_manifest"], kinds={"mtrag"},
    code_version=RECORD_VERSION,
    description="A shadow generation built by `mtrag build --profile NAME` beside the live index (its own stores, "
                "the live raw snapshots, CAS and embedding cache reused); one partition per profile. "
                "docs/shadow.md")
shadow_comparison = dg.AssetSpec(
    "shadow_comparison", partitions_def=PROFILES, group_name="shadow", deps=[shadow_generation], kinds={"mtrag"},
    code_version=RECORD_VERSION,
    description="`mtrag compare live NAME`: the same queries against the live generation and the profile's, "
                "per query and overall (recall, MRR, latency); one partition per profile. docs/shadow.md")
SHADOW_ASSETS = [shadow_generation, shadow_comparison]


def _instance(live: Settings) -> dg.DagsterInstance:
    from mtrag_assets.runner import dagster_instance
    return dagster_instance(live)


def _settings_metadata(profile: dict) -> dict:
    return {"profile": profile["name"], "settings": dg.MetadataValue.json(
        {k: profile.get(k) for k in ("embedder", "fusion", "ranker", "neo4j_uri", "qdrant", "description")
         if profile.get(k)})}


def record_shadow_build(live: Settings, profile: dict, manifest: dict) -> None:
    instance = _instance(live)
    instance.add_dynamic_partitions(PROFILES.name, [profile["name"]])
    quality = manifest.get("quality") or {}
    metadata = {**_settings_metadata(profile), "shadow_generation": int(manifest["generation"]),
                "chunks": sum(e.get("counts", {}).get("chunks", 0) for e in manifest["sources"].values()),
                "embedder": manifest["embedder"].get("fingerprint_id", ""),
                "home": dg.MetadataValue.path(str(live.shadow_home(profile["name"])))}
    if quality:
        metadata["golden_recall"] = float(quality["recall"])
    instance.report_runless_asset_event(dg.AssetMaterialization(
        "shadow_generation", partition=profile["name"], metadata=metadata,
        tags={"mtrag/profile": profile["name"]}))


def record_comparison(live: Settings, report: dict, markdown: str) -> None:
    """A comparison of the live generation (either side) with a profile's is the profile's."""
    names = [report["a"]["name"], report["b"]["name"]]
    profile = next((n for n in reversed(names) if n != "live"), None)
    if profile is None:
        return
    instance = _instance(live)
    instance.add_dynamic_partitions(PROFILES.name, [profile])
    metadata: dict = {"against": names[0] if names[1] == profile else names[1],
                      "queries": len(report["queries"]), "worse": len(report["worse"]),
                      "report": dg.MetadataValue.md(markdown)}
    for side in names:
        for figure, value in report["summary"][side].items():
            if isinstance(value, (int, float)) and figure not in ("queries", "judged"):
                metadata[f"{'profile' if side == profile else 'against'}_{figure}"] = float(value)
    instance.report_runless_asset_event(dg.AssetMaterialization(
        "shadow_comparison", partition=profile, metadata=metadata, tags={"mtrag/profile": profile}))


def record_publish(live: Settings, manifest: dict, how: str) -> None:
    """A cut-over (`how` = "cutover") or a rollback published `manifest` as the live generation."""
    step = manifest.get(how) or {}
    metadata = {"generation": int(manifest["generation"]), how: step.get("profile", ""),
                "previous_generation" if how == "cutover" else "restored_generation":
                    int(step.get("previous" if how == "cutover" else "restored", 0))}
    if manifest.get("serving"):
        metadata["serving"] = dg.MetadataValue.json(manifest["serving"])
    if manifest.get("quality"):
        metadata["golden_recall"] = float(manifest["quality"]["recall"])
    _instance(live).report_runless_asset_event(dg.AssetMaterialization(
        "index_manifest", metadata=metadata, tags={f"mtrag/{how}": step.get("profile", "")}))
