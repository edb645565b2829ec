"""The live AI Hub device list, in a process of its own (`python -m hexstudio.workers.aihub_devices --spec FILE`):
importing qai_hub takes a second and the listing is network I/O, so neither the studio's window nor its event
loop waits on them, and a listing that hangs can be stopped.

Spec: the settings (AI Hub URLs, retries) only. Token: $HEXSTUDIO_AIHUB_TOKEN (the studio passes the keyring's),
else the qai_hub client's client.ini. Writes devices.json (hexstudio.shared.aihub_devices.DeviceListing) to
out_dir; errors are the AI Hub stage's (no token, cannot reach AI Hub, refused).
"""

from __future__ import annotations

import sys
from typing import Any

from hexstudio.shared.aihub_devices import DEVICES_FILE
from hexstudio.shared.protocol import Emitter
from hexstudio.workers.aihub import list_devices
from hexstudio.workers.runtime import WorkerSpec, worker_main


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    em.progress(0.1, "asking AI Hub for the account's devices")
    listing = list_devices(spec.settings)
    listing.write(spec.out_dir / DEVICES_FILE)
    return {"devices": len(listing.devices), "usable": len(listing.usable), "emulated": listing.emulated}


if __name__ == "__main__":
    sys.exit(worker_main("aihub_devices", run))
