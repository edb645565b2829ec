"""`hexstudio serve` over a bundle of real QNN context binaries: Qualcomm's libGenie 1.21 on the HTP simulator
answers the OpenAI client, says so in /stats and the headers, and takes the request's stop strings itself."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.qnn.conftest import needs_qnn
from tests.support.serve import start_serve

pytestmark = [needs_qnn, pytest.mark.slow]
openai = pytest.importorskip("openai")


def test_serve_runs_real_genie_on_the_htp_simulator(local_run: Path, tmp_path: Path) -> None:
    ws = local_run.parent.parent
    proc, port = start_serve(ws, local_run.name, tmp_path / "port", timeout=180)
    try:
        base = f"http://127.0.0.1:{port}"
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
