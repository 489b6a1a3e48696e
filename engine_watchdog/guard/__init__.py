"""The guard: a streaming reverse proxy in front of the engine's API (docs/guard.md).

It is a probe (per-request progress, as :class:`~engine_watchdog.core.model.GuardObs`) and an
actor (it ends the streams and refuses the requests the supervisor says), never a judge.
"""
