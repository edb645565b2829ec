"""Compile through Qualcomm AI Hub with the real qai_hub client against the local EMULATOR
(tests/aihub_emulator): the jobs and the bundle as qai-hub-models builds them, resume by job id after a
kill, clear errors for injected failures and for what AI Hub refuses.

Graph and tensor names are read from the run's quantize.json, never hard-coded."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import signal
import time
import zipfile
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml

from hexstudio.core.jobs import LocalJob
from hexstudio.core.manifest import RunManifest
from hexstudio.core.pipeline import Pipeline, PipelineResult
from hexstudio.core.runs import Workspace
from hexstudio.shared import bundle as gb
from hexstudio.workers import bundle_metadata as gm
from hexstudio.workers.aihub import JOBS_FILE
from tests.aihub_emulator import AIHubEmulator
from tests.aihub_emulator.server import QAIRT_VERSIONS
from tests.compile.genie_bundles import BUNDLE_FILES
from tests.support.sim_runs import copy_run

pytestmark = pytest.mark.timeout(240)


def _aihub_run(validated_run: Path, root: Path, emu: AIHubEmulator, **settings: Any) -> RunManifest:
    dest = copy_run(validated_run, root)
    m = Workspace(root).open_run(dest.name)
    m.settings.update({**emu.run_settings(), **settings})
    m.save()
    return m


def _compile(m: RunManifest, **kw: Any) -> PipelineResult:
    return asyncio.run(Pipeline(m, **kw).run(only="compile"))


def _quantize(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "artifacts" / "quantize" / "quantize.json").read_text()))


def _graph_names(run_dir: Path) -> list[str]:
    return [g["name"] for g in _quantize(run_dir)["graphs"]]


MODEL = "tiny_llama"  # builtin:tiny-llama, as qai-hub-models names its models (file and job names)
QAIRT_FULL = QAIRT_VERSIONS["2.42"]


def test_compile_through_the_emulator_writes_a_complete_labeled_bundle(
    validated_run: Path, tmp_path: Path, aihub_emulator: AIHubEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hexstudio.core import secrets

    emu = aihub_emulator
    # the token comes from the keyring (the pipeline passes it to the worker), not the environment
    monkeypatch.delenv("HEXSTUDIO_AIHUB_TOKEN")
    secrets.set_secret(secrets.AIHUB_TOKEN, emu.token)
    m = _aihub_run(validated_run, tmp_path / "ws", emu)
    t0 = time.monotonic()
    res = _compile(m)
    assert res.ok, f"{res.message} / {res.hint}"
    assert time.monotonic() - t0 < 60

    bdir = m.run_dir / "artifacts" / "compile" / "bundle"
    assert gb.verify_bundle(bdir) == []
    doc = json.loads((bdir / "bundle.json").read_text())
    assert doc["emulated"] is True and doc["simulated"] is False
    assert doc["device"]["name"] == "Dragonwing IQ-9075 EVK"
    assert (doc["device"]["soc_model"], doc["device"]["dsp_arch"]) == (77, "v73")
    assert doc["qairt_version"] == "2.42" and doc["qairt_full_version"] == QAIRT_FULL
    assert (doc["context_length"], doc["parts"], doc["precision"]) == (512, 2, "w4a16")
    names = {f["path"] for f in doc["files"]}
    bins = [f"{MODEL}_part_1_of_2.bin", f"{MODEL}_part_2_of_2.bin"]
    assert names == {*bins, *BUNDLE_FILES, "tool-versions.yaml", "EMULATED.txt"}
    # every file and checksum, recomputed here as well
    for f in doc["files"]:
        assert (
            gb.sha256_file(bdir / f["path"]) == f["sha256"] and (bdir / f["path"]).stat().st_size == f["size"]
        )
    cfg = json.loads((bdir / "genie_config.json").read_text())["dialog"]
    assert cfg["engine"]["model"]["binary"]["ctx-bins"] == bins and cfg["context"]["size"] == 512
    assert cfg["engine"]["backend"]["type"] == "QnnHtp"
    htp = json.loads((bdir / "htp_backend_ext_config.json").read_text())
    assert htp["devices"][0]["soc_model"] == 77 and htp["devices"][0]["dsp_arch"] == "v73"
    # tool-versions.yaml: only the full QAIRT version AI Hub recorded on the linked model (the EMULATED label
    # is a comment)
    tv = (bdir / "tool-versions.yaml").read_text()
    assert yaml.safe_load(tv) == {"qairt": QAIRT_FULL} and tv.startswith("# EMULATED")
    # metadata.yaml: each component's I/O as quantize.json names it, with AI Hub's compiled dtypes
    q = _quantize(m.run_dir)
    meta = gm.read_metadata(bdir / "metadata.yaml")
    assert (meta["precision"], meta["runtime"]) == ("w4a16", "genie")
    assert sorted(meta["components"]) == sorted(gm.component_name(g["name"]) for g in q["graphs"])
    for g in q["graphs"]:
        comp = meta["components"][gm.component_name(g["name"])]
        assert list(comp["inputs"]) == g["inputs"] and list(comp["outputs"]) == g["outputs"]
        for t, spec in {**comp["inputs"], **comp["outputs"]}.items():
            if spec["dtype"].startswith("int"):  # input_ids: not quantized
                assert "quantization_parameters" not in spec, t
                continue
            assert spec["dtype"] == ("uint8" if gm.is_kv(t) else "uint16"), t
            if gm.is_kv(t) and "quantization_parameters" in spec:  # 8-bit symmetric
                assert spec["quantization_parameters"]["offset"] == -128, t
    assert meta == gm.build_metadata(q["graphs"], m.run_dir / "artifacts" / "quantize")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (bdir / name).read_bytes() == (m.run_dir / "artifacts" / "model" / "hf" / name).read_bytes()

    # what reached "AI Hub": per graph one `<model>_<prompt|token>_<i>_of_<n>.aimet` upload and compile job,
    # one link per part `<model>_part_<i>_of_<n>` joining [prompt, token]
    graphs = {g["name"]: g for g in q["graphs"]}
    assert emu.submissions == {"compile": 4, "link": 2} and emu.uploads == 4
    for part, b in enumerate(bins, start=1):
        with zipfile.ZipFile(bdir / b) as z:
            linked = json.loads(z.read("emulated.json"))
            assert "EMULATED" in z.read("README.txt").decode()
        assert (
            linked["emulated"] is True
            and linked["kind"] == "link"
            and linked["options"] == "--qairt_version 2.42"
        )
        assert linked["graphs"] == [f"prompt_ar128_cl512_{part}_of_2", f"token_ar1_cl512_{part}_of_2"]
        assert linked["qairt_version"] == QAIRT_FULL
    links = {j.pb.link_job.name for j in emu.jobs.values() if j.kind == "link"}
    assert links == {f"{MODEL}_part_1_of_2", f"{MODEL}_part_2_of_2"}
    compiles = {j.pb.compile_job.name: j.pb.compile_job for j in emu.jobs.values() if j.kind == "compile"}
    assert set(compiles) == {f"{MODEL}_{gm.component_name(g)}" for g in graphs}
    for g, entry in graphs.items():
        cj = compiles[f"{MODEL}_{gm.component_name(g)}"]
        assert cj.options == (
            f"--target_runtime qnn_dlc --qairt_version 2.42 --output_names "
            f"{','.join(entry['outputs'])} --quantize_io --qnn_options context_enable_graphs={g} "
            "--quantize_full_type w8a16"
        )
        base = f"{MODEL}_{gm.component_name(g)}"
        upload = emu.models[cj.model.model_id]
        assert upload.pb.name == f"{base}.aimet" and upload.pb.is_directory
        with zipfile.ZipFile(io.BytesIO(upload.data or b"")) as z:
            assert sorted(n for n in z.namelist() if not n.endswith("/")) == [
                f"{base}.aimet/{base}.{ext}" for ext in ("data", "encodings", "onnx")
            ]
            # the integer-encoded weights travel as their integers (tests/compile/test_aihub_upload.py: the same
            # integers come back)
            up = onnx.load_model_from_string(z.read(f"{base}.aimet/{base}.onnx"))
            assert sum(i.data_type == onnx.TensorProto.INT8 for i in up.graph.initializer) >= 7
            part_data = (m.run_dir / "artifacts" / "quantize" / entry["onnx"]).parent / "model.data"
            assert z.getinfo(f"{base}.aimet/{base}.data").file_size < 0.5 * part_data.stat().st_size
    assert not (m.run_dir / "artifacts" / "compile" / "aimet").exists(), "staged uploads are removed"

    # job ids: in the bundle manifest, compile.json, the jobs file and the run's metrics
    ids = {j.job_id for j in emu.jobs.values()}
    assert {j["job_id"] for j in doc["aihub_jobs"]} == ids and len(doc["aihub_jobs"]) == 6
    assert all(j["url"].startswith(emu.web_url) for j in doc["aihub_jobs"])
    cj = json.loads((m.run_dir / "artifacts" / "compile" / "compile.json").read_text())
    assert cj["emulated"] is True and {j["state"] for j in cj["jobs"]} == {"SUCCESS"}
    stored = json.loads((m.run_dir / JOBS_FILE).read_text())
    assert {r["job_id"] for r in stored["jobs"].values()} == ids
    m2 = Workspace(tmp_path / "ws").open_run(m.run_dir.name)
    metrics = m2.stage("compile").data["metrics"]
    assert metrics["emulated"]["value"] is True and metrics["simulated"]["value"] is False
    assert {v["value"] for k, v in metrics.items() if k.startswith("aihub_") and k != "aihub_jobs"} == ids
    # the upload's size was announced before anything was sent, and is what was sent
    assert metrics["upload_planned_bytes"]["value"] == pytest.approx(
        metrics["upload_sent_bytes"]["value"], rel=0.01
    )
    first = next(
        json.loads(ln)
        for ln in (m.run_dir / "logs" / "compile.jsonl").read_text().splitlines()
        if '"progress"' in ln
    )
    assert first["message"].startswith("AI Hub upload: ") and " ETA " in first["message"], first
    assert "100 Mbit/s (assumed; set aihub_link_mbps" in first["message"]
    assert emu.token not in (m.run_dir / "run.json").read_text()

    # the uplink the uploads measured is kept per AI Hub address for the next compile's ETA
    uplinks = json.loads((tmp_path / "ws" / "aihub-uplink.json").read_text())["uplinks"]
    assert list(uplinks) == [emu.api_url], uplinks
    assert (
        uplinks[emu.api_url]["bytes"] == metrics["upload_sent_bytes"]["value"]
        and uplinks[emu.api_url]["mbps"] > 0
    )

    # forcing the stage again with the same inputs reuses the finished jobs: nothing is submitted
    res = asyncio.run(Pipeline(m2).run(only="compile", force=True))
    assert res.ok and emu.submissions == {"compile": 4, "link": 2} and emu.uploads == 4
    again = [
        json.loads(ln)
        for ln in (m.run_dir / "logs" / "compile.jsonl").read_text().splitlines()
        if '"progress"' in ln and "AI Hub upload: " in ln
    ][-1]
    assert f"Mbit/s (measured {uplinks[emu.api_url]['measured_at'][:10]} over " in again["message"], again
    # nothing is sent again, and the announcement says so (it counted every graph as to be uploaded)
    assert again["message"].startswith("AI Hub upload: 0.00 GB in 0 graphs (4 submitted before"), again


def test_a_restart_while_waiting_resumes_by_job_id(
    validated_run: Path, tmp_path: Path, aihub_emulator: AIHubEmulator
) -> None:
    emu = aihub_emulator
    emu.hold_jobs()  # a slow compile: jobs stay running
    m = _aihub_run(validated_run, tmp_path / "ws", emu)
    pipe: Pipeline

    on_disk: dict[str, Any] = {}

    def on_event(stage: str, ev: dict[str, Any]) -> None:
        if ev.get("type") == "log" and "waiting for AI Hub compile jobs" in ev["message"]:
            # had the studio itself died here, run.json on disk would already hold every job id
            on_disk.update(json.loads((m.run_dir / "run.json").read_text())["stages"]["compile"]["metrics"])
            job = pipe.current_job
            assert isinstance(job, LocalJob) and job.proc is not None
            os.killpg(job.proc.pid, signal.SIGKILL)  # like a crash or kill -9 mid-wait

    pipe = Pipeline(m, on_event=on_event)
    res = asyncio.run(pipe.run(only="compile"))
    assert not res.ok and m.stage("compile").state == "interrupted"
    assert emu.submissions == {"compile": 4, "link": 0}
    stored = json.loads((m.run_dir / JOBS_FILE).read_text())
    assert len(stored["jobs"]) == 4 and not (m.run_dir / "artifacts" / "compile").exists()
    # the job ids reached run.json while the stage was waiting, not only at success
    run_json = json.loads((m.run_dir / "run.json").read_text())
    metrics = run_json["stages"]["compile"]["metrics"]
    recorded = {k: v["value"] for k, v in metrics.items() if k.startswith("aihub_compile_")}
    assert set(recorded.values()) == {r["job_id"] for r in stored["jobs"].values()} == set(emu.jobs)
    assert set(recorded) == {f"aihub_compile_{g}" for g in _graph_names(m.run_dir)}
    assert {k: v["value"] for k, v in on_disk.items() if k.startswith("aihub_compile_")} == recorded

    emu.release_jobs()
    events: list[dict[str, Any]] = []
    res = _compile(
        Workspace(tmp_path / "ws").open_run(m.run_dir.name), on_event=lambda st, ev: events.append(ev)
    )
    assert res.ok, f"{res.message} / {res.hint}"
    assert emu.submissions == {"compile": 4, "link": 2} and emu.uploads == 4  # nothing submitted twice
    assert sum("reusing AI Hub compile job" in e.get("message", "") for e in events) == 4
    assert any(e["type"] == "progress" and e["message"].startswith("AI Hub link") for e in events)
    assert gb.verify_bundle(m.run_dir / "artifacts" / "compile" / "bundle") == []


def test_a_submit_that_never_answered_is_found_on_resume_not_made_twice(
    validated_run: Path, tmp_path: Path, aihub_emulator: AIHubEmulator
) -> None:
    """AI Hub took a job, then the answer was lost (a time-out, a proxy reset). The resume submitted the job
    again: a second compile (or link) of the same inputs in the account, and the upload sent twice. It now
    asks AI Hub for the job the lost submit made."""
    emu = aihub_emulator
    m = _aihub_run(validated_run, tmp_path / "ws", emu)
    emu.lose_submit_answers(1, "compile")
    res = _compile(m)
    assert not res.ok and _error(m)["code"] == "aihub_connection_lost", _error(m)
    assert "before AI Hub answered" in _error(m)["message"], _error(m)
    assert emu.submissions == {"compile": 1, "link": 0} and emu.uploads == 1
    assert list(json.loads((m.run_dir / JOBS_FILE).read_text())["submitting"]) == [
        f"compile:{_graph_names(m.run_dir)[0]}"
    ]

    emu.lose_submit_answers(1, "link")
    events: list[dict[str, Any]] = []
    m = Workspace(tmp_path / "ws").open_run(m.run_dir.name)
    res = _compile(m, on_event=lambda st, ev: events.append(ev))
    assert not res.ok
    # the lost compile was found, and its upload not sent again
    assert emu.submissions == {"compile": 4, "link": 1} and emu.uploads == 4
    assert sum("whose submit did not answer" in e.get("message", "") for e in events) == 1

    res = _compile(Workspace(tmp_path / "ws").open_run(m.run_dir.name))
    assert res.ok, f"{res.message} / {res.hint}"
    assert emu.submissions == {"compile": 4, "link": 2} and emu.uploads == 4
    stored = json.loads((m.run_dir / JOBS_FILE).read_text())
    assert not stored.get("submitting") and set(emu.jobs) == {r["job_id"] for r in stored["jobs"].values()}
    assert gb.verify_bundle(m.run_dir / "artifacts" / "compile" / "bundle") == []


def _error(m: RunManifest) -> dict[str, Any]:
    return Workspace(m.run_dir.parent.parent).open_run(m.run_dir.name).stage("compile").data["outcome"]


FAILURES = {
    "bad_token": ("aihub_auth", "rejected the API token", "token"),
    "rate_limited": ("aihub_rate_limited", "429", "Wait a few minutes"),
    "failed_job": ("aihub_job_failed", "failed: Op 'MatMul_7' is not supported by the HTP backend", "/jobs/"),
    "unavailable_device": (
        "aihub_device_unavailable",
        "no device named 'Dragonwing IQ-9999'",
        "Dragonwing IQ-9075 EVK",
    ),
    "old_device": ("device_unsupported", "cannot run LPBQ", "v73"),  # v68: LPBQ checked first
    "no_weight_sharing": ("device_unsupported", "does not support weight sharing", "v73"),  # v69
    "no_consent": ("aihub_consent_required", "uploads model-derived files", "aihub_consent=true"),
    "unreachable": ("aihub_unreachable", "Could not reach Qualcomm AI Hub at http://127.0.0.1:", "proxy"),
}


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("failure", list(FAILURES))
def test_injected_failures_give_clear_errors_and_the_run_stays_resumable(
    failure: str, validated_run: Path, tmp_path: Path, aihub_emulator: AIHubEmulator
) -> None:
    emu = aihub_emulator
    settings: dict[str, Any] = {}
    if failure == "bad_token":
        emu.fail_auth = True
    elif failure == "rate_limited":
        emu.rate_limit(None)
    elif failure == "failed_job":
        emu.fail_next(
            "compile", "Op 'MatMul_7' is not supported by the HTP backend", graph="token_ar1_cl512_2_of_2"
        )
    elif failure == "unavailable_device":
        settings["device"] = "Dragonwing IQ-9999"
    elif failure == "old_device":
        settings["device"] = "RB3 Gen 2 (Proxy)"
    elif failure == "no_weight_sharing":
        settings["device"] = "Snapdragon 8 Gen 1 QRD"
    elif failure == "no_consent":
        settings["aihub_consent"] = False
    elif failure == "unreachable":
        settings["aihub_api_url"] = f"http://127.0.0.1:{_closed_port()}"
    m = _aihub_run(validated_run, tmp_path / "ws", emu, **settings)
    t0 = time.monotonic()
    res = _compile(m)
    assert time.monotonic() - t0 < 60, "an injected failure must not sit in client retries"
    code, in_message, in_hint = FAILURES[failure]
    assert not res.ok and m.stage("compile").state == "failed"
    out = _error(m)
    assert out["code"] == code, out
    assert in_message in out["message"] and in_hint in (out["hint"] or ""), out
    assert emu.token not in json.dumps(out)
    if (
        failure == "bad_token"
    ):  # HexStudio's token is in use: a new one in qai_hub's client.ini changes nothing
        assert "qai-hub configure" not in (out["hint"] or ""), out
    if failure == "failed_job":
        failed = next(j for j in emu.jobs.values() if j.outcome == "failed")
        assert failed.job_id in out["message"] and f"/jobs/{failed.job_id}/" in out["hint"]
        assert (m.run_dir / "logs" / "aihub" / f"{failed.job_id}_hub.log").is_file()
    if failure in (
        "unavailable_device",
        "old_device",
        "no_weight_sharing",
        "no_consent",
        "bad_token",
        "unreachable",
    ):
        assert emu.uploads == 0, "nothing may be uploaded before the checks pass"
    before = dict(emu.submissions)

    # fix the cause, resume the same run: it completes, resubmitting only what never succeeded
    emu.fail_auth = False
    emu.rate_limit(0)
    m = Workspace(tmp_path / "ws").open_run(m.run_dir.name)
    m.settings.update(
        {"device": "Dragonwing IQ-9075 EVK", "aihub_consent": True, "aihub_api_url": emu.api_url}
    )
    m.save()
    res = _compile(m)
    assert res.ok, f"{res.message} / {res.hint}"
    assert gb.verify_bundle(m.run_dir / "artifacts" / "compile" / "bundle") == []
    if failure == "failed_job":
        assert before == {"compile": 4, "link": 0}
        assert emu.submissions == {"compile": 5, "link": 2}  # only the failed graph again
        stored = json.loads((m.run_dir / JOBS_FILE).read_text())
        assert [f["graph"] for f in stored["failed"]] == ["token_ar1_cl512_2_of_2"]
    else:
        assert emu.submissions == {"compile": 4, "link": 2}


def test_device_picker_rows_from_the_cli_and_the_client_ini_token(
    tmp_path: Path, aihub_emulator: AIHubEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    from hexstudio.workers import aihub
    from hexstudio.workers.runtime import WorkerError

    out = subprocess.run(
        [str(Path(sys.executable).with_name("hexstudio")), "bundle", "devices", "--aihub", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["emulated"] is True
    rows = {r["name"]: r for r in doc["devices"]}
    iq = rows["Dragonwing IQ-9075 EVK"]
    assert (iq["dsp_arch"], iq["soc_model"], iq["weight_sharing"], iq["supported"]) == ("v73", 77, True, True)
    assert iq["chipset"] == "qualcomm-qcs9075" and iq["os"]
    assert rows["RB3 Gen 2 (Proxy)"]["supported"] is False and "LPBQ" in rows["RB3 Gen 2 (Proxy)"]["reason"]
    g1 = rows["Snapdragon 8 Gen 1 QRD"]  # v69: LPBQ yes, weight sharing no
    assert g1["supported"] is False and "weight sharing" in g1["reason"] and "LPBQ" not in g1["reason"]

    # no token anywhere: a clear error; an existing client.ini (api_token, api_url, web_url) is used
    for var in ("HEXSTUDIO_AIHUB_TOKEN", "HEXSTUDIO_AIHUB_API_URL", "HEXSTUDIO_AIHUB_WEB_URL"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(tmp_path / "none" / "client.ini"))
    with pytest.raises(WorkerError) as ei:
        aihub.list_devices()
    assert ei.value.code == "aihub_token_missing" and "qai-hub configure" in (ei.value.hint or "")
    # a client.ini without its [api] header: the parser's own words quote the line, the token with it
    broken = tmp_path / "broken" / "client.ini"
    broken.parent.mkdir()
    broken.write_text("api_token = SECRET-in-a-broken-ini\napi_url = https://example.invalid\n")
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(broken))
    with pytest.raises(WorkerError) as ei:
        aihub.list_devices()
    assert ei.value.code == "aihub_token_missing" and "SECRET" not in ei.value.message + (ei.value.hint or "")
    assert str(broken) in ei.value.message
    monkeypatch.setenv(
        "QAIHUB_CLIENT_INI", str(aihub_emulator.write_client_ini(tmp_path / "q" / "client.ini"))
    )
    assert "Dragonwing IQ-9075 EVK" in {d.name for d in aihub.list_devices().devices}


def test_a_recorded_job_gone_from_ai_hub_is_submitted_again(
    validated_run: Path, tmp_path: Path, aihub_emulator: AIHubEmulator
) -> None:
    emu = aihub_emulator
    m = _aihub_run(validated_run, tmp_path / "ws", emu)
    assert _compile(m).ok
    stored = json.loads((m.run_dir / JOBS_FILE).read_text())
    gone = [stored["jobs"][f"link:part{i}"]["job_id"] for i in (1, 2)]
    for job in gone:
        del emu.jobs[job]  # expired on AI Hub
    m = Workspace(tmp_path / "ws").open_run(m.run_dir.name)
    res = asyncio.run(Pipeline(m).run(only="compile", force=True))
    out = _error(m)
    # both are named at once, and one resume submits both again (not one job a resume)
    assert not res.ok and out["code"] == "aihub_job_missing" and all(j in out["message"] for j in gone), out
    res = _compile(Workspace(tmp_path / "ws").open_run(m.run_dir.name))
    assert res.ok and emu.submissions == {"compile": 4, "link": 4}


def test_cancel_while_waiting_keeps_the_jobs_for_the_next_attempt(
    validated_run: Path, tmp_path: Path, aihub_emulator: AIHubEmulator
) -> None:
    emu = aihub_emulator
    emu.hold_jobs()
    m = _aihub_run(validated_run, tmp_path / "ws", emu)
    pipe: Pipeline

    def on_event(stage: str, ev: dict[str, Any]) -> None:
        if ev.get("type") == "log" and "waiting for AI Hub compile jobs" in ev["message"]:
            asyncio.get_running_loop().create_task(pipe.cancel())  # the Cancel button

    pipe = Pipeline(m, on_event=on_event)
    res = asyncio.run(pipe.run(only="compile"))
    assert not res.ok and m.stage("compile").state == "cancelled"
    assert len(json.loads((m.run_dir / JOBS_FILE).read_text())["jobs"]) == 4
    emu.release_jobs()
    assert _compile(Workspace(tmp_path / "ws").open_run(m.run_dir.name)).ok
    assert emu.submissions == {"compile": 4, "link": 2}


def _tamper_encodings_version(run_dir: Path) -> None:
    q = _quantize(run_dir)
    path = run_dir / "artifacts" / "quantize" / q["graphs"][-1]["encodings"]
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "version": "0.6.1"}))


def _tamper_outputs(run_dir: Path) -> None:
    qpath = run_dir / "artifacts" / "quantize" / "quantize.json"
    q = json.loads(qpath.read_text())
    q["graphs"][0]["outputs"] = [*q["graphs"][0]["outputs"], "hidden_states_renamed"]
    qpath.write_text(json.dumps(q, indent=2))


# What AI Hub refuses (the emulator checks it as the real service would) and what the worker refuses first.
REFUSALS: dict[str, tuple[dict[str, Any], Any, str, str, bool]] = {
    # case: (run settings, tamper the run, error code, words of the message, anything uploaded)
    "unknown_option": (
        {"aihub_compile_options": "--turbo"},
        None,
        "aihub_job_failed",
        "unrecognized option '--turbo'",
        True,
    ),
    "unknown_qairt": (
        {"qairt_version": "2.99"},
        None,
        "aihub_job_failed",
        "QAIRT version '2.99' is not available",
        True,
    ),
    "old_encodings": ({}, _tamper_encodings_version, "aihub_job_failed", "expected version 1.0.0", True),
    "output_not_in_graph": ({}, _tamper_outputs, "bundle_check", "hidden_states_renamed", False),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_ai_hub_refuses_fails_the_stage_with_its_reason(
    case: str, validated_run: Path, tmp_path: Path, aihub_emulator: AIHubEmulator
) -> None:
    emu = aihub_emulator
    settings, tamper, code, words, uploaded = REFUSALS[case]
    m = _aihub_run(validated_run, tmp_path / "ws", emu, **settings)
    if tamper is not None:
        tamper(m.run_dir)
    res = _compile(m)
    out = _error(m)
    assert not res.ok and out["code"] == code, out
    assert words in out["message"], out
    assert (emu.uploads > 0) is uploaded
    if code == "aihub_job_failed":
        assert any(words in r for r in emu.failure_reasons.values())
        assert emu.submissions["link"] == 0


def test_a_chipset_alias_after_the_chipset_does_not_replace_it() -> None:
    from hexstudio.workers.aihub import parse_device

    d = parse_device(
        "Dragonwing IQ-9075 EVK",
        "1.7",
        [
            "chipset:qualcomm-qcs9075",
            "chipset:qcs9075",
            "hexagon:v73",
            "soc-model:77",
            "htp-supports-weight-sharing:true",
        ],
    )
    assert (d["chipset"], d["dsp_arch"], d["soc_model"], d["weight_sharing"]) == (
        "qualcomm-qcs9075",
        "v73",
        77,
        True,
    )
    # the alias first (AI Hub promises no order; sorted, it would come first): the vendor's name still wins
    d = parse_device(
        "Dragonwing IQ-9075 EVK", "1.7", ["chipset:qcs9075", "chipset:qualcomm-qcs9075", "hexagon:v73"]
    )
    assert d["chipset"] == "qualcomm-qcs9075"


def test_ai_hub_bundles_carry_the_speculative_dialogs_asked_for(
    validated_run: Path, tmp_path: Path, aihub_emulator: AIHubEmulator
) -> None:
    """issue 29 on the AI Hub path: spd's config is written beside the basic one; lade on the built-in model (840
    tokens, an embedding AI Hub compiles as exported) is refused with the reason before anything is uploaded."""
    emu = aihub_emulator
    lade = _aihub_run(validated_run, tmp_path / "ws-lade", emu, speculative_dialogs="lade")
    res = _compile(lade)
    assert not res.ok and "1000+" in res.message and "Compile locally" in res.message, res.message
    assert emu.uploads == 0 and emu.submissions.get("compile", 0) == 0
    m = _aihub_run(validated_run, tmp_path / "ws", emu, speculative_dialogs="spd", spd_draft_len=2)
    res = _compile(m)
    assert res.ok, f"{res.message} / {res.hint}"
    bdir = m.run_dir / "artifacts" / "compile" / "bundle"
    assert gb.verify_bundle(bdir) == []
    names = {f["path"] for f in json.loads((bdir / "bundle.json").read_text())["files"]}
    assert {"genie_config.json", "genie_config.spd.json"} <= names
    basic = json.loads((bdir / "genie_config.json").read_text())["dialog"]
    spd = json.loads((bdir / "genie_config.spd.json").read_text())["dialog"]
    assert basic["type"] == "basic" and spd["type"] == "spd" and spd["spd"]["draft-len"] == 2
    assert [e["role"] for e in spd["engine"]] == ["draft", "target"]
    assert spd["engine"][1]["model"]["binary"]["ctx-bins"] == basic["engine"]["model"]["binary"]["ctx-bins"]
    # a device not known offline: the draft (compiled for v73) is checked against AI Hub's word on its arch before
    # anything is uploaded, not after every part compiled and linked
    from hexstudio.shared.data import builtin_model_dir
    from tests.qnn.test_speculative import _draft

    draft = _draft(tmp_path / "draft")  # an IQ-9075 (v73) draft with this model's tokenizer
    shutil.copyfile(builtin_model_dir() / "tokenizer.json", draft / "tokenizer.json")
    uploads = emu.uploads
    other = _aihub_run(
        validated_run,
        tmp_path / "ws-s25",
        emu,
        speculative_dialogs="spd",
        spd_draft=str(draft),
        device="Samsung Galaxy S25 (Family)",
    )
    res = _compile(other)
    assert not res.ok and "dsp_arch v73 and this bundle's for v79" in res.message, res.message
    assert emu.uploads == uploads


def test_the_bundle_takes_the_one_qairt_version_the_parts_were_linked_with() -> None:
    """tool-versions.yaml holds the version AI Hub recorded on the linked models: parts linked with two
    versions are refused (the board would run one QAIRT for both), and no recorded version falls back to the
    requested one with a warning that says so."""
    from hexstudio.shared.protocol import Emitter
    from hexstudio.workers.aihub import linked_qairt
    from hexstudio.workers.runtime import WorkerError

    out = io.StringIO()
    em = Emitter(out)
    assert linked_qairt({0: "2.37.1.250807", 1: "2.37.1.250807"}, "2.37", em) == "2.37.1.250807"
    assert out.getvalue() == ""
    with pytest.raises(WorkerError) as err:
        linked_qairt({0: "2.37.1.250807", 1: "2.36.0.250627"}, "2.37", em)
    assert err.value.code == "aihub_qairt_mismatch"
    assert "part 0: 2.37.1.250807, part 1: 2.36.0.250627" in err.value.message
    assert "aihub_jobs.json" in (err.value.hint or "")
    assert linked_qairt({0: None, 1: None}, "2.37", em) == "2.37"
    (warning,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert warning["code"] == "aihub_qairt_unknown" and "2.37" in warning["message"]


def test_the_device_compiled_for_is_exactly_the_one_named() -> None:
    """An empty device setting is AI Hub's 'no filter': the account's first device was compiled for. A name
    filter is not an equality either: only the device of that name is taken."""
    from types import SimpleNamespace

    from hexstudio.workers import aihub
    from hexstudio.workers.runtime import WorkerError

    def dev(name: str) -> Any:
        return SimpleNamespace(name=name, os="1.0", attributes=["chipset:qualcomm-qcs9075", "htp-version:73"])

    listing = [dev("Dragonwing IQ-9075 EVK (Proxy)"), dev("Dragonwing IQ-9075 EVK")]
    client = SimpleNamespace(get_devices=lambda name="": [d for d in listing if name in d.name])
    with pytest.raises(WorkerError, match="device setting is empty"):
        aihub.resolve_device(client, "", lpbq=True)
    assert (
        aihub.resolve_device(client, "Dragonwing IQ-9075 EVK", lpbq=True)["name"] == "Dragonwing IQ-9075 EVK"
    )


def test_inputs_changed_and_changed_back_reuse_their_own_jobs(tmp_path: Path) -> None:
    """QAIRT 2.42 compiled, 2.41 tried, then 2.42 again: the 2.42 jobs were dropped when 2.41 began and every
    compile and link job was paid for again."""
    from hexstudio.workers.aihub import JobStore

    path = tmp_path / JOBS_FILE
    a = JobStore(path, "inputs-2.42")
    a.put("compile:part1", {"job_id": "jA1", "state": "SUCCESS"})
    b = JobStore(path, "inputs-2.41")
    assert b.jobs == {} and b.kept_for_earlier_inputs == 1
    b.put("compile:part1", {"job_id": "jB1", "state": "SUCCESS"})
    again = JobStore(path, "inputs-2.42")
    assert again.jobs == {"compile:part1": {"job_id": "jA1", "state": "SUCCESS"}}
    assert again.kept_for_earlier_inputs == 1  # the 2.41 set, kept for its own inputs
    again.save()
    assert JobStore(path, "inputs-2.41").jobs["compile:part1"]["job_id"] == "jB1"


def test_a_job_ai_hub_never_finishes_ends_the_wait_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state the client does not know reads as UNSPECIFIED, neither done nor failed: the wait never ended."""
    import contextlib
    from types import SimpleNamespace

    from hexstudio.shared.protocol import Emitter
    from hexstudio.workers import aihub
    from hexstudio.workers.runtime import WorkerError

    store = aihub.JobStore(tmp_path / JOBS_FILE, "inputs")
    store.put("compile:g", {"job_id": "jX", "kind": "compile", "what": "g", "url": "u", "state": "SUBMITTED"})
    stuck = SimpleNamespace(code="UNSPECIFIED", success=False, failure=False, message=None)
    client = SimpleNamespace(get_job=lambda _id: SimpleNamespace(get_status=lambda: stuck))
    monkeypatch.setattr(aihub, "WAIT_LIMIT_S", 0.2)
    with pytest.raises(WorkerError) as err:
        aihub.wait_jobs(
            client,
            store,
            ["compile:g"],
            Emitter(io.StringIO()),
            0.05,
            0.0,
            1.0,
            "compile",
            tmp_path,
            lambda _what: contextlib.nullcontext(),
        )
    assert err.value.code == "aihub_timeout" and "jX (UNSPECIFIED)" in err.value.message
    assert "nothing is submitted twice" in (err.value.hint or "")
    assert (
        aihub.JobStore(tmp_path / JOBS_FILE, "inputs").jobs["compile:g"]["job_id"] == "jX"
    )  # kept for resume


def test_a_lost_submit_is_never_matched_to_a_job_that_failed(tmp_path: Path) -> None:
    """A compile job failed and its resubmit's answer was lost before AI Hub took it. The lookup for the job the
    lost submit made took the failed one (same name, same inputs, inside the clock-skew window): the resume then
    waited on a job that had failed already, and failed again."""
    import io
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from hexstudio.shared.protocol import Emitter
    from hexstudio.workers.aihub import JobStore, _HubCompile

    store = JobStore(tmp_path / JOBS_FILE, "key")
    store.failed.append({"job_id": "jfailed", "what": "g1", "state": "FAILED", "reason": "Op not supported"})
    store.submitting["compile:g1"] = {"what": "g1", "inputs": ["m1"], "t": time.time()}
    failed = SimpleNamespace(job_id="jfailed", name="g1", date=datetime.now(timezone.utc))
    client = SimpleNamespace(
        get_job_summaries=lambda **kw: [failed] if kw["offset"] == 0 else [],
        get_job=lambda job_id: SimpleNamespace(job_id=job_id, model=SimpleNamespace(model_id="m1")),
    )
    hc = _HubCompile(client, None, store, Emitter(io.StringIO()), "http://hub", "http://hub", 1.0, tmp_path)
    assert hc._unanswered("compile:g1", "compile", ["m1"]) is None
    # a job the lost submit did make is found
    made = SimpleNamespace(job_id="jnew", name="g1", date=datetime.now(timezone.utc))
    client.get_job_summaries = lambda **kw: [made, failed] if kw["offset"] == 0 else []
    assert hc._unanswered("compile:g1", "compile", ["m1"]).job_id == "jnew"


def test_only_another_ai_hub_address_changes_the_job_files_key() -> None:
    """Qualcomm's own AI Hub adds nothing to the job file's key (the jobs of runs compiled before the address was
    part of it keep being reused); another address (the emulator) keeps its jobs apart."""
    from qai_hub.public_rest_api import DEFAULT_HUB_API_URL

    from hexstudio.workers.aihub import hub_address_key

    assert (
        hub_address_key(DEFAULT_HUB_API_URL) == "" == hub_address_key(DEFAULT_HUB_API_URL.rstrip("/") + "/")
    )
    assert hub_address_key("http://127.0.0.1:8123/api/") == "\nhttp://127.0.0.1:8123/api/"


def test_a_failed_transfer_through_ai_hubs_storage_is_said_not_a_bug() -> None:
    """The client moves files through Amazon S3 with credentials AI Hub hands it; botocore's and s3transfer's
    errors are neither qai_hub's nor requests', so a proxy that let AI Hub through but not S3 ended the stage as
    "a HexStudio bug", and a failed job's log download raised before its reason was shown."""
    from botocore.exceptions import EndpointConnectionError
    from s3transfer.exceptions import S3UploadFailedError

    from hexstudio.workers.aihub import hub_errors, quiet_hub_errors
    from hexstudio.workers.runtime import WorkerError

    for exc in (
        EndpointConnectionError(endpoint_url="https://bucket.s3.amazonaws.com"),
        S3UploadFailedError("403"),
    ):
        with pytest.raises(WorkerError) as err, hub_errors("uploading part 1", "https://api", "https://web"):
            raise exc
        assert err.value.code == "aihub_storage" and "amazonaws.com" in (err.value.hint or ""), err.value
        with quiet_hub_errors():  # a job's log: passed over, as AI Hub's own errors are
            raise exc
    with pytest.raises(ZeroDivisionError), quiet_hub_errors():  # anything else is a bug, and raised
        raise ZeroDivisionError


def test_a_job_submit_is_never_repeated_by_the_client_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client re-POSTs a request whose answer was lost (a read time-out, a dropped connection): for a job
    submit that makes a second job, and HexStudio's lookup of an unanswered submit never applied. Its retries are
    off for the submit alone, and back on after."""
    import io

    import qai_hub.util.session as hs
    import requests

    from hexstudio.shared.protocol import Emitter
    from hexstudio.workers.aihub import JobStore, _HubCompile

    # another test's in-process configure_client may have set the module's retries to 0
    monkeypatch.setattr(hs, "MAX_RETRIES", 3)
    before = hs.TRANSIENT_HTTP_EXCEPTIONS
    seen: list[Any] = []
    hc = _HubCompile(
        None,
        None,
        JobStore(tmp_path / "aihub_jobs.json", "k"),
        Emitter(io.StringIO()),
        "a",
        "w",
        1.0,
        tmp_path,
    )

    def submit() -> str:
        seen.append((hs.TRANSIENT_HTTP_EXCEPTIONS, hs.MAX_RETRIES))
        return "job"

    assert hc.submit_once("compile:g", "compile", "g", ["m1"], submit) == "job"
    # a lost answer is not retried; a connect time-out (nothing sent) and 429/5xx answers still are
    assert seen == [((requests.exceptions.ConnectTimeout,), hs.MAX_RETRIES)] and hs.MAX_RETRIES > 0
    assert before == hs.TRANSIENT_HTTP_EXCEPTIONS


def test_a_rate_limit_while_polling_is_waited_out() -> None:
    """A 429 burst (or an overloaded AI Hub) while polling ended the stage, although the jobs ran on; it is now
    waited out for a while. A refusal is no such thing, and still ends it at once."""
    import io

    from hexstudio.shared.protocol import Emitter
    from hexstudio.workers.aihub import poll_status
    from hexstudio.workers.runtime import WorkerError

    answers: list[Any] = [
        WorkerError("aihub_rate_limited", "Qualcomm AI Hub is rate-limiting this account.", "Wait."),
        WorkerError("aihub_unavailable", "Qualcomm AI Hub answered 503.", "Wait."),
        "RUNNING",
    ]

    class Job:
        def get_status(self) -> Any:
            a = answers.pop(0)
            if isinstance(a, Exception):
                raise a
            return a

    slept: list[float] = []
    log = io.StringIO()
    assert poll_status(
        Job(), lambda what: contextlib.nullcontext(), "compile job j1", Emitter(log), slept.append
    ) == ("RUNNING")
    assert slept == [15.0, 30.0] and "Asking again in 15 s" in log.getvalue()
    answers[:] = [WorkerError("aihub_auth", "rejected the token", "Log in.")]
    with pytest.raises(WorkerError, match="rejected the token"):
        poll_status(
            Job(), lambda what: contextlib.nullcontext(), "compile job j1", Emitter(log), slept.append
        )
