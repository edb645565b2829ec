"""A real worker process for testing the job runner and pipeline: behaviour chosen by settings["mode"].

ok       progress, a metric (plus settings["metrics_<stage>"]), an artifact file, done
slow     writes half its output, then loops for settings["seconds"] (for kill -9 / cancel tests);
         also starts a child process (settings["child_pidfile"]) so orphan cleanup can be checked
garbage  prints lines that are not the protocol and exits 0 without done
crash    prints to stderr and exits 3 without done
error    fails with a WorkerError (code, message, hint)
flood    emits settings["events"] progress/log events as fast as it can, then done
busy     busy and silent (a long calibration unit): writes its pid to settings["pidfile"], starts a busy
         child (settings["child_pidfile"]), then computes for settings["seconds"] without a single event
stubborn ignores SIGINT and SIGTERM (noting each in settings["signal_log"]) and starts a child that
         ignores them too (settings["child_pidfile"]): only SIGKILL to the group ends them
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from hexstudio.shared.protocol import Emitter
from hexstudio.workers.runtime import WorkerError, WorkerSpec, worker_main


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    mode = spec.hooks.get(f"mode_{spec.stage}", spec.hooks.get("mode", "ok"))
    out = spec.out_dir
    if mode == "ok":
        em.progress(0.5, "half way")
        (out / "result.txt").write_text(f"attempt by pid {os.getpid()}\n")
        em.artifact("result.txt", kind="text", role="result")
        em.metric("answer", 42, unit="")
        for name, value in (spec.hooks.get(f"metrics_{spec.stage}") or {}).items():
            em.metric(name, value)  # e.g. validate's verdict, preflight's checks_failed (gate tests)
        em.progress(1.0, "finished")
        return {"mode": mode}
    if mode == "slow":
        (out / "half.txt").write_text("half-written output\n")
        pidfile = spec.hooks.get("child_pidfile")
        if pidfile:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            with open(pidfile, "w") as fh:
                fh.write(str(child.pid))
        seconds = float(spec.hooks.get("seconds", 60))
        t0 = time.time()
        while time.time() - t0 < seconds:
            em.progress(min(0.99, (time.time() - t0) / seconds), "working")
            time.sleep(0.05)
        (out / "result.txt").write_text("complete\n")
        return {"mode": mode}
    if mode == "busy":
        child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        with open(spec.hooks["child_pidfile"], "w") as fh:
            fh.write(str(child.pid))
        with open(spec.hooks["pidfile"], "w") as fh:
            fh.write(str(os.getpid()))
        t0 = time.time()
        n = 0
        while time.time() - t0 < float(spec.hooks.get("seconds", 600)):
            n += sum(
                i * i for i in range(100000)
            )  # never writes to the (dead) pipe: only the kernel stops it
        return {"mode": mode}
    if mode == "garbage":
        print("Traceback? no, just noise", flush=True)
        print("{not json", flush=True)
        sys.stdout.flush()
        os._exit(0)
    if mode == "crash":
        print("segfault-like crash in native code", file=sys.stderr, flush=True)
        os._exit(3)
    if mode == "error":
        raise WorkerError(
            "bad_input", "The calibration file is empty.", "Choose a text file with some prose."
        )
    if mode == "stubborn":
        log = spec.hooks["signal_log"]

        def note(signum: int, frame: object) -> None:
            with open(log, "a") as fh:
                fh.write(f"{signal.Signals(signum).name} ignored by {os.getpid()}\n")

        signal.signal(signal.SIGINT, note)
        signal.signal(signal.SIGTERM, note)
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import signal, time\n"
                "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "time.sleep(600)\n",
            ]
        )
        with open(spec.hooks["child_pidfile"], "w") as fh:
            fh.write(str(child.pid))
        while True:
            em.progress(0.5, "not listening")
            time.sleep(0.05)
    if mode == "flood":
        n = int(spec.hooks.get("events", 100000))
        for i in range(n):
            if i % 2:
                em.log(f"line {i}")
            else:
                em.progress(i / n, "flood")
        return {"events": n}
    raise WorkerError("bad_mode", f"unknown mode {mode}")


if __name__ == "__main__":
    raise SystemExit(worker_main("fake", run))
