"""The AI Hub account's devices, live (the Compile page's Refresh from AI Hub and `hexstudio bundle devices
--aihub`): hexstudio/workers/aihub_devices.py asks AI Hub in a process of its own, with the keyring's token passed
by environment; this service starts it, stops it when AI Hub does not answer in time, and reads its devices.json
through the typed reader both sides share (hexstudio.shared.aihub_devices)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hexstudio.core import logs
from hexstudio.core.jobs import JobRunner
from hexstudio.core.services import ServiceError
from hexstudio.core.stage_api import worker_env_async
from hexstudio.shared.aihub_devices import DEVICES_FILE, DeviceListing, DeviceListingError
from hexstudio.shared.worker_spec import WorkerSpec

WORKER = "hexstudio.workers.aihub_devices"
LISTING_TIMEOUT_S = 120.0
# Someone is waiting at the Compile page (or the terminal): 2 quick retries (~1.5 s) before "cannot reach AI Hub",
# not the client's 6 with backoff (~30 s); a compile keeps the client's patience.
LISTING_RETRIES = {"aihub_http_retries": 2, "aihub_http_backoff_s": 0.5}
LOG_NAME = "aihub-devices.jsonl"  # the last listing's worker log, in the studio's log folder


def log_path() -> Path:
    return logs.log_dir() / LOG_NAME


async def list_aihub_devices(timeout_s: float = LISTING_TIMEOUT_S) -> DeviceListing:
    """The account's devices, the usable ones first. ServiceError says what failed and what to do: no token,
    AI Hub unreachable or refusing, no answer within `timeout_s` (the worker is stopped then)."""
    log = log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hexstudio-aihub-devices-") as tmp:
        job_dir = Path(tmp)
        spec = WorkerSpec.build("aihub_devices", job_dir, job_dir / "out", LISTING_RETRIES)
        job = await JobRunner().start_local(
            WORKER,
            spec.write(job_dir / "spec.json"),
            env=await worker_env_async(),
            log_path=log,
            what="The AI Hub device list",
        )
        try:
            res = await asyncio.wait_for(job.wait(), timeout_s)
        except asyncio.TimeoutError:
            await job.cancel()
            raise ServiceError(
                f"AI Hub did not answer within {timeout_s:.0f} s.",
                "Check the network (and a proxy, if you use one), then refresh again.",
            ) from None
        except asyncio.CancelledError:
            await job.cancel()
            raise
        if not res.ok:
            raise ServiceError(
                res.message or "Listing the AI Hub devices failed.",
                res.hint or f"The worker's log is {log}.",
            )
        try:
            return DeviceListing.read(spec.out_dir / DEVICES_FILE)
        except DeviceListingError as exc:
            raise ServiceError(
                f"The AI Hub device list could not be read: {exc}.",
                f"This is a HexStudio bug; the worker's log is {log}. Please report it.",
            ) from None
