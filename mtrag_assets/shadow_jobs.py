"""The shadow commands as jobs a maintainer launches from the UI's launchpad, the profile as run
config (docs/shadow.md#in-the-dagster-ui): `shadow_build` (`mtrag build --profile NAME`),
`shadow_cutover` (`mtrag cutover NAME`) and `shadow_rollback` (`mtrag rollback`). Each op runs the
command in a process of its own, the one code path the CLI takes (a shadow build runs its stages in
the shadow's own instance), with its output in the run's log; a command that fails fails the run
with its one-line error."""

import os
import subprocess
import sys

import dagster as dg


class ProfileConfig(dg.Config):
    profile: str
    accept_quality_drop: bool = False


def _run_command(context: dg.OpExecutionContext, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "MTRAG_BUILD_SERVER": "off"}, check=False)
    for line in (proc.stdout + proc.stderr).splitlines():
        context.log.info(line)
    if proc.returncode != 0:
        raise dg.Failure(description=f"mtrag {' '.join(args)} exited {proc.returncode}: "
                                     f"{(proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:]}")
    return proc.stdout


@dg.op(description="`mtrag build --profile NAME`: a shadow generation of every source, beside the live one")
def build_shadow(context: dg.OpExecutionContext, config: ProfileConfig) -> None:
    _run_command(context, "build", "--profile", config.profile)


@dg.op(description="`mtrag cutover NAME`: the profile's generation becomes live if the golden gate passes")
def cut_over(context: dg.OpExecutionContext, config: ProfileConfig) -> None:
    _run_command(context, "cutover", config.profile,
                 *(["--accept-quality-drop"] if config.accept_quality_drop else []))


@dg.op(description="`mtrag rollback`: the generation the served cut-over replaced is live again")
def roll_back(context: dg.OpExecutionContext) -> None:
    _run_command(context, "rollback")


@dg.job(description="Build a shadow generation of every source with a profile of profiles.yaml "
                    "(run config: ops.build_shadow.config.profile). docs/shadow.md", tags={"mtrag/shadow": "build"})
def shadow_build():
    build_shadow()


@dg.job(description="Make a profile's shadow generation the live one in one step, if the golden-query gate "
                    "passes (run config: ops.cut_over.config.profile). docs/shadow.md#cut-over",
        tags={"mtrag/shadow": "cutover"})
def shadow_cutover():
    cut_over()


@dg.job(description="Publish again the generation the served cut-over replaced. docs/shadow.md#cut-over",
        tags={"mtrag/shadow": "rollback"})
def shadow_rollback():
    roll_back()


SHADOW_JOBS = [shadow_build, shadow_cutover, shadow_rollback]
