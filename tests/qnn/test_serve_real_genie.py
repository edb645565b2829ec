"""`hexstudio serve` over a bundle of real QNN context binaries: Qualcomm's libGenie 1.21 on the HTP simulator
answers the OpenAI client, says so in /stats and the headers, and takes the request's stop strings itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.qnn.conftest import needs_qnn

pytestmark = [needs_qnn, pytest.mark.slow]
openai = pytest.importorskip("openai")


def test_serve_runs_real_genie_on_the_htp_simulator(local_run: Path, tmp_path: Path) -> None:
    ws = local_run.parent.parent
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hexstudio",
            "serve",
            "--board",
            "sim",
            "--run",
            local_run.name,
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ],
        env={**os.environ, "HEXSTUDIO_WORKSPACE": str(ws)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not port_file.is_file() or not port_file.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"hexstudio serve did not start: {proc.communicate()[0]}")
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port_file.read_text()}"
        c = openai.OpenAI(base_url=base + "/v1", api_key="unused-on-loopback", max_retries=0, timeout=300)
        raw = c.completions.with_raw_response.create(
            model="builtin:tiny-llama",
            prompt="The capital of France is",
            max_tokens=8,
            temperature=0,
            stop=["."],
        )
        assert raw.headers["x-hexstudio-source"] == "simulated"
        stopped = raw.parse()
        with urllib.request.urlopen(base + "/stats") as r:
            st = json.loads(r.read())
        assert "HTP simulator" in str(st.get("runtime_version")) and "1.21" in str(
            st.get("runtime_version")
        ), st
        k = stopped.model_extra["hexstudio"]
        assert k["runtime"] == "genie" and k["stop_by"] == "genie", k  # Genie's own stop sequence
        assert stopped.choices[0].text == " Paris", stopped.choices[0].text  # the "." left out, as Genie does
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0]
    assert "SIMULATED" in out and "Traceback" not in out, out
