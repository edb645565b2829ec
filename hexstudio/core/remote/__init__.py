"""Run a run's heavy stages on a worker host over SSH, streaming the same events as a local job.

For users whose workstation is too small for the model: the heavy stage runs on a bigger Linux box. One
module per job:

    hosts   the worker hosts in the settings: config, connect (host keys verified, never auto-added
            silently), check the host's Python and packages
    sync    the workers installed on the host once per version; folders uploaded (what is there is
            skipped) and downloaded; host paths mapped back to this machine's
    job     RemoteJob: one worker on the host, its events, memory and cancel (the job runner's)
    stage   RemoteStageJob and start_worker_job: a pipeline stage there, from connect to download

The programs run on the host besides the workers are modules of hexstudio.workers.remote. The transport is
hexstudio.core.device's Transport (docs/CONTRACTS.md §4).
"""

from __future__ import annotations

from hexstudio.core.remote.stage import RemoteStageJob, remote_host_for, start_worker_job

__all__ = ["RemoteStageJob", "remote_host_for", "start_worker_job"]
