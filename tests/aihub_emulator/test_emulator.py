"""The emulator against the REAL qai_hub client: protocol, labels, state transitions, failures."""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

import pytest
import qai_hub as hub
from qai_hub.client import JobStatus, RateLimitedError

from tests.aihub_emulator import EMULATED_ATTRIBUTE, AIHubEmulator

IQ9075 = "Dragonwing IQ-9075 EVK"


def _aimet_dir(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "model.onnx").write_bytes(b"onnx-bytes-" + name.encode())
    (d / "model.encodings").write_text(json.dumps({"version": "1.0.0"}))
    return d


def _until_finished(job: hub.client.Job, limit_s: float = 10.0) -> JobStatus:
    t0 = time.monotonic()
    while True:
        st = job.get_status()
        if st.finished:
            return st
        assert time.monotonic() - t0 < limit_s, f"job stuck in {st.state}"
        time.sleep(0.02)


def _until_state(job: hub.client.Job, state: JobStatus.State, limit_s: float = 10.0) -> None:
    t0 = time.monotonic()
    while (st := job.get_status()).state != state:
        assert not st.finished and time.monotonic() - t0 < limit_s, f"never reached {state}: {st.state}"
        time.sleep(0.02)


def test_devices_carry_the_attributes_the_worker_reads(aihub_emulator: AIHubEmulator) -> None:
    c = hub.Client(config=aihub_emulator.client_config())
    devs = {d.name: d for d in c.get_devices()}
    iq = devs[IQ9075]
    for a in ("chipset:qualcomm-qcs9075", "hexagon:v73", "soc-model:77", "htp-supports-weight-sharing:true",
              "framework:qnn", EMULATED_ATTRIBUTE):
        assert a in iq.attributes
    assert any("hexagon:v68" in d.attributes for d in devs.values())
    assert [d.name for d in c.get_devices(attributes="hexagon:v73")] == [IQ9075]
    assert c.get_devices(name="No Such Device") == []


def test_compile_link_download_with_the_real_client(aihub_emulator: AIHubEmulator, tmp_path: Path) -> None:
    c = hub.Client(config=aihub_emulator.client_config())
    dev = hub.Device(IQ9075)
    t0 = time.monotonic()
    jobs = []
    aihub_emulator.hold_jobs()  # pin the running state so the test sees it whatever the machine's load
    for g in ("prompt_ar128_cl512_1_of_2", "token_ar1_cl512_1_of_2"):
        jobs.append(c.submit_compile_job(str(_aimet_dir(tmp_path, g)), dev, name=g, retry=False,
                                         options=f"--target_runtime qnn_dlc --qairt_version 2.42 "
                                                 f"--qnn_options context_enable_graphs={g}"))
    for j in jobs:
        _until_state(j, JobStatus.State.OPTIMIZING_MODEL)
    aihub_emulator.release_jobs()
    for j in jobs:
        assert _until_finished(j).success
        assert j.get_target_model().model_type == hub.SourceModelType.QNN_DLC
    aihub_emulator.hold_jobs()
    link = c.submit_link_job([j.get_target_model() for j in jobs], dev, name="part1", options="--qairt_version 2.42")
    _until_state(link, JobStatus.State.LINKING_MODELS)
    aihub_emulator.release_jobs()
    assert _until_finished(link).success
    path = link.download_target_model(str(tmp_path))
    with zipfile.ZipFile(path) as z:
        assert "EMULATED" in z.read("README.txt").decode()
        meta = json.loads(z.read("emulated.json"))
    assert meta["emulated"] is True and meta["kind"] == "link"
    assert meta["graphs"] == ["prompt_ar128_cl512_1_of_2", "token_ar1_cl512_1_of_2"]
    logs = link.download_job_logs(str(tmp_path / "logs"))
    assert len(logs) == 1 and "emulated" in Path(logs[0]).read_text()
    assert aihub_emulator.submissions == {"compile": 2, "link": 1} and aihub_emulator.uploads == 2
    assert time.monotonic() - t0 < 10


def test_injected_failures(aihub_emulator: AIHubEmulator, tmp_path: Path) -> None:
    emu = aihub_emulator
    dev = hub.Device(IQ9075)
    bad = hub.Client(config=emu.client_config(token="wrong"))
    with pytest.raises(hub.UserError, match="Failed to authenticate"):
        bad.get_devices()
    c = hub.Client(config=emu.client_config())
    model = c.upload_model(str(_aimet_dir(tmp_path, "g")))
    emu.rate_limit(1)
    t0 = time.monotonic()
    with pytest.raises((RateLimitedError, hub.InternalError), match=r"429|hrottled|Too Many"):
        c.submit_compile_job(model, dev, options="--target_runtime qnn_dlc", retry=False)
    assert time.monotonic() - t0 < 5, "the fixture must keep the client from sitting in retries"
    assert emu.submissions["compile"] == 0
    emu.fail_next("compile", "Tensor 'x' has an unsupported type.")
    job = c.submit_compile_job(model, dev, options="--target_runtime qnn_dlc", retry=False)
    st = _until_finished(job)
    assert st.failure and st.message == "Tensor 'x' has an unsupported type."
    emu.hold_jobs()
    slow = c.submit_compile_job(model, dev, options="--target_runtime qnn_dlc", retry=False)
    time.sleep(0.4)
    assert slow.get_status().running
    emu.release_jobs()
    assert _until_finished(slow).success
