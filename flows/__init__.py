"""The pipeline's stages as Prefect flows, and the lake they build.

Prefect reads its settings when it is first imported, so the package sets them up
(`flows.prefect_env.configure`) before any of its modules imports Prefect."""
from flows.prefect_env import configure

configure()
