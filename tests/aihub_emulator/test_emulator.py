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


def _aimet_dir(
    tmp_path: Path,
    name: str,
    outputs: tuple[str, ...] = ("logits",),
    data: bool = True,
    encodings_version: str = "1.0.0",
    extra: str | None = None,
) -> Path:
    """`<name>.aimet/` as qai-hub-models uploads a part: <name>.onnx (weights in <name>.data) + <name>.encodings."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    d = tmp_path / f"{name}.aimet"
    d.mkdir(parents=True)
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], [o]) for o in outputs]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, 4]) for o in outputs],
        [w],
    )
    model = helper.make_model(graph)
    if data:
        onnx.save(
            model,
            str(d / f"{name}.onnx"),
            save_as_external_data=True,
            location=f"{name}.data",
            size_threshold=0,
        )
    else:
        onnx.save(model, str(d / f"{name}.onnx"))
    # 1.0.0: lists of named encodings; 0.6.1 (legacy): dicts keyed by tensor name
    enc: dict[str, object] = (
        {"activation_encodings": [], "param_encodings": []}
        if not encodings_version.startswith("0.")
        else {"activation_encodings": {}, "param_encodings": {}}
    )
    (d / f"{name}.encodings").write_text(json.dumps({"version": encodings_version, **enc}))
    if extra:
        (d / extra).write_text("x")
    return d


def _opts(graph: str, outputs: str = "logits", qairt: str = "2.42") -> str:
    return (
        f"--target_runtime qnn_dlc --qairt_version {qairt} --output_names {outputs} --quantize_io "
        f"--qnn_options context_enable_graphs={graph} --quantize_full_type w8a16"
    )


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
    for a in (
        "chipset:qualcomm-qcs9075",
        "hexagon:v73",
        "soc-model:77",
        "htp-supports-weight-sharing:true",
        "framework:qnn",
        EMULATED_ATTRIBUTE,
    ):
        assert a in iq.attributes
    # as AI Hub reports it (qai-hub-models v0.47.0 devices_and_chipsets.yaml: Qualcomm Linux 1.7), with its ABI
    assert iq.os == "1.7" and "os:qc_linux" in iq.attributes and "abi:aarch64-oe-linux-gcc11" in iq.attributes
    # the alias sorted first (AI Hub promises no order; the worker takes the vendor's name wherever it stands:
    # tests/compile/test_aihub.py)
    assert [a for a in iq.attributes if a.startswith("chipset:")] == [
        "chipset:qcs9075",
        "chipset:qualcomm-qcs9075",
    ]
    assert all(any(a.startswith("abi:") for a in d.attributes) for d in devs.values())
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
        jobs.append(
            c.submit_compile_job(str(_aimet_dir(tmp_path, g)), dev, name=g, retry=False, options=_opts(g))
        )
    for j in jobs:
        _until_state(j, JobStatus.State.OPTIMIZING_MODEL)
    aihub_emulator.release_jobs()
    for j in jobs:
        assert _until_finished(j).success
        assert j.get_target_model().model_type == hub.SourceModelType.QNN_DLC
    aihub_emulator.hold_jobs()
    link = c.submit_link_job(
        [j.get_target_model() for j in jobs], dev, name="part1", options="--qairt_version 2.42"
    )
    _until_state(link, JobStatus.State.LINKING_MODELS)
    aihub_emulator.release_jobs()
    assert _until_finished(link).success
    path = link.download_target_model(str(tmp_path))
    with zipfile.ZipFile(path) as z:
        assert "EMULATED" in z.read("README.txt").decode()
        meta = json.loads(z.read("emulated.json"))
    assert meta["emulated"] is True and meta["kind"] == "link"
    assert meta["graphs"] == ["prompt_ar128_cl512_1_of_2", "token_ar1_cl512_1_of_2"]
    # the linked model carries the full QAIRT version, as AI Hub's do (qai-hub-models reads it for tool-versions.yaml)
    assert (
        link.get_target_model().metadata[hub.ModelMetadataKey.QAIRT_SDK_VERSION]
        == "2.42.0.251225135753_193295"
    )
    assert jobs[0].get_target_model().metadata[hub.ModelMetadataKey.QAIRT_SDK_VERSION].startswith("2.42.0.")
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
        c.submit_compile_job(model, dev, options=_opts("g"), retry=False)
    assert time.monotonic() - t0 < 5, "the fixture must keep the client from sitting in retries"
    assert emu.submissions["compile"] == 0
    emu.fail_next("compile", "Tensor 'x' has an unsupported type.")
    job = c.submit_compile_job(model, dev, options=_opts("g"), retry=False)
    st = _until_finished(job)
    assert st.failure and st.message == "Tensor 'x' has an unsupported type."
    emu.hold_jobs()
    slow = c.submit_compile_job(model, dev, options=_opts("g"), retry=False)
    time.sleep(0.4)
    assert slow.get_status().running
    emu.release_jobs()
    assert _until_finished(slow).success


# What the real service refuses. Each case: how to build the upload and the options -> words of the reason.
REFUSALS = {
    "unknown_option": (
        dict(),
        "--target_runtime qnn_dlc --qnn_options context_enable_graphs=g --fast_please",
        "unrecognized option '--fast_please'",
    ),
    "bad_value": (
        dict(),
        "--target_runtime qnn_dlc --quantize_full_type w2a2 --qnn_options context_enable_graphs=g",
        "Invalid value 'w2a2' for option '--quantize_full_type'",
    ),
    "unknown_qnn_option": (
        dict(),
        "--target_runtime qnn_dlc --qnn_options context_enable_graphs=g;turbo=1",
        "unknown option 'turbo'",
    ),
    "unknown_qairt": (dict(), _opts("g", qairt="1.0"), "QAIRT version '1.0' is not available"),
    "no_graph_name": (dict(), "--target_runtime qnn_dlc --quantize_io", "context_enable_graphs=<name>"),
    "bad_graph_name": (dict(), _opts("prompt-1.of.2"), "Invalid graph name 'prompt-1.of.2'"),
    "no_data": (dict(data=False, extra="g.data"), _opts("g"), "does not reference as its external data"),
    "unknown_encodings": (
        dict(encodings_version="0.5.0"),
        _opts("g"),
        "Unsupported AIMET encodings format in g.encodings: version '0.5.0'",
    ),
    "unverified_encodings": (
        dict(encodings_version="2.0.0"),
        _opts("g"),
        "[emulator] AIMET encodings format 2.0.0",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_the_compile_checks_the_real_service_makes(
    case: str, aihub_emulator: AIHubEmulator, tmp_path: Path
) -> None:
    build, options, reason = REFUSALS[case]
    c = hub.Client(config=aihub_emulator.client_config())
    model = c.upload_model(str(_aimet_dir(tmp_path, "g", **build)))  # type: ignore[arg-type]
    job = c.submit_compile_job(model, hub.Device(IQ9075), options=options, retry=False)
    st = _until_finished(job)
    assert st.failure and reason in (st.message or ""), st.message
    assert aihub_emulator.failure_reasons[job.job_id] == st.message
    # the same upload with the options qai-hub-models sends compiles
    if case not in ("no_data", "unknown_encodings", "unverified_encodings"):
        assert _until_finished(
            c.submit_compile_job(model, hub.Device(IQ9075), options=_opts("g"), retry=False)
        ).success


def test_what_qai_hub_models_sends_compiles(aihub_emulator: AIHubEmulator, tmp_path: Path) -> None:
    """qai-hub-models' own strings: --output_names lists the WHOLE model's outputs for every split part (names
    that are not outputs of the part are ignored), --quantize_io twice, the legacy 0.6.1 encodings too."""
    c = hub.Client(config=aihub_emulator.client_config())
    whole = ",".join(["logits"] + [f"past_{kv}_{i}_out" for i in range(4) for kv in ("key", "value")])
    part1 = "token_ar1_cl512_1_of_2"
    options = (
        f"--target_runtime qnn_dlc --qairt_version 2.42 --output_names {whole} --quantize_io "
        f"--qnn_options context_enable_graphs={part1} --quantize_full_type w8a16 --quantize_io"
    )
    for graph, outputs, version in (
        (part1, ("hidden_out",), "1.0.0"),  # part 1: no logits, no KV
        ("prompt_ar128_cl512_2_of_2", ("logits", "past_key_3_out"), "0.6.1"),
    ):
        opts = options.replace(part1, graph)
        job = c.submit_compile_job(
            str(_aimet_dir(tmp_path / graph, graph, outputs, encodings_version=version)),
            hub.Device(IQ9075),
            options=opts,
            retry=False,
        )
        assert _until_finished(job).success, aihub_emulator.failure_reasons
        with zipfile.ZipFile(job.download_target_model(str(tmp_path / graph / "out"))) as z:
            meta = json.loads(z.read("emulated.json"))
        assert meta["output_names"] == [o for o in outputs if o in whole.split(",")]


def test_the_qnn_options_qualcomm_uses(aihub_emulator: AIHubEmulator, tmp_path: Path) -> None:
    """Keys from qai-hub-models and the qai_hub client's own examples; repeated --qnn_options add up (the client's
    submit_compile_and_link_jobs appends its own); a link takes --qnn_options too; an unknown key is refused."""
    c = hub.Client(config=aihub_emulator.client_config())
    iq = hub.Device(IQ9075)
    dlcs = []
    for g in ("prompt_ar128_cl512_1_of_1", "token_ar1_cl512_1_of_1"):
        opts = (
            f"--qnn_options default_graph_htp_precision=FLOAT16 --qnn_options context_enable_graphs={g} "
            "--target_runtime qnn_dlc --qnn_options default_graph_htp_optimization_value=3"
        )
        j = c.submit_compile_job(str(_aimet_dir(tmp_path / g, g)), iq, options=opts, retry=False)
        assert _until_finished(j).success, aihub_emulator.failure_reasons
        assert j.get_target_model().metadata[hub.ModelMetadataKey.QNN_MODEL_GRAPH_NAMES] == g
        dlcs.append(j.get_target_model())
    ok = c.submit_link_job(
        dlcs,
        iq,
        name="part_1_of_1",
        options="--qairt_version 2.42 --qnn_options default_graph_htp_optimizations=O=3",
    )
    assert _until_finished(ok).success, aihub_emulator.failure_reasons
    bad = _until_finished(c.submit_link_job(dlcs, iq, name="part_1_of_1", options="--qnn_options turbo=1"))
    assert bad.failure and "unknown option 'turbo'" in (bad.message or "")
    assert "context_enable_graphs, context_error_reporting_options_level" in (bad.message or "")


def test_the_aimet_encodings_formats(tmp_path: Path) -> None:
    from tests.aihub_emulator.server import JobRefused, check_aimet_encodings

    check_aimet_encodings(
        "a.encodings",
        {"version": "1.0.0", "activation_encodings": [{"name": "x", "bw": 16}], "param_encodings": []},
    )
    check_aimet_encodings(
        "a.encodings",
        {"version": "0.6.1", "activation_encodings": {"x": [{"bitwidth": 16}]}, "param_encodings": {}},
    )
    for doc, reason in (
        (
            {"version": "1.0.0", "activation_encodings": {}, "param_encodings": []},
            "'activation_encodings' must be a list of encodings with a name in format 1.0.0. Its "
            "'activation_encodings' has the shape of format 0.6.1: expected version 0.6.1.",
        ),
        (
            {"version": "0.6.1", "activation_encodings": {}, "param_encodings": []},
            "'param_encodings' must be a dict keyed by tensor name in format 0.6.1. Its "
            "'param_encodings' has the shape of format 1.0.0: expected version 1.0.0.",
        ),
        (
            {"version": "1.0.0", "activation_encodings": [{"bw": 8}], "param_encodings": []},
            "must be a list of encodings with a name in format 1.0.0.",
        ),
        ({"version": "2.1.0"}, "[emulator]"),
        ({"activation_encodings": []}, "version None"),
        ([], "version None"),
    ):
        with pytest.raises(JobRefused) as ei:
            check_aimet_encodings("a.encodings", doc)
        assert reason in str(ei.value), str(ei.value)


def test_an_upload_the_client_would_not_make_is_refused_too(tmp_path: Path) -> None:
    """The client refuses a directory with other files before uploading; the emulator checks the archive too."""
    from qai_hub import public_api_pb2 as pb
    from qai_hub.util.zipped_model import zip_model

    from tests.aihub_emulator.server import JobRefused, uploaded_model_outputs

    aimet = _aimet_dir(tmp_path, "g", extra="notes.txt")
    data = Path(zip_model(str(tmp_path / "zip"), str(aimet))).read_bytes()
    with pytest.raises(JobRefused, match=r"must contain exactly one \.onnx file"):
        uploaded_model_outputs(pb.MODEL_TYPE_AIMET_ONNX, data, True)
    (aimet / "notes.txt").unlink()
    (aimet / "g.encodings").unlink()
    data = Path(zip_model(str(tmp_path / "zip2"), str(aimet))).read_bytes()
    with pytest.raises(JobRefused, match=r"has no \.encodings file"):
        uploaded_model_outputs(pb.MODEL_TYPE_AIMET_ONNX, data, True)


def test_the_link_checks_the_real_service_makes(aihub_emulator: AIHubEmulator, tmp_path: Path) -> None:
    c = hub.Client(config=aihub_emulator.client_config())
    iq, g3 = hub.Device(IQ9075), hub.Device("Snapdragon 8 Gen 3 QRD")

    def dlc(graph: str, device: hub.Device = iq, again: bool = False) -> hub.Model:
        where = tmp_path / graph / str(device.name).replace(" ", "_") / ("again" if again else "first")
        j = c.submit_compile_job(str(_aimet_dir(where, graph)), device, options=_opts(graph), retry=False)
        assert _until_finished(j).success
        m = j.get_target_model()
        assert m is not None
        return m

    p, t = dlc("prompt_ar128_cl512_1_of_2"), dlc("token_ar1_cl512_1_of_2")
    cases = [
        ([p, dlc("token_ar1_cl512_1_of_2", g3)], iq, "--qairt_version 2.42", "not for the link job's device"),
        (
            [p, dlc("prompt_ar128_cl512_1_of_2", iq, again=True)],
            iq,
            "--qairt_version 2.42",
            "graphs with the same name (prompt_ar128_cl512_1_of_2)",
        ),
        ([p, t], iq, "--qairt_version 2.42 --quantize_io", "unrecognized option '--quantize_io'"),
        ([p, t], iq, "--qairt_version 2.41", "QAIRT version '2.41' is not available"),
    ]
    for models, device, options, reason in cases:
        st = _until_finished(c.submit_link_job(models, device, name="part_1_of_2", options=options))
        assert st.failure and reason in (st.message or ""), (options, st.message)
    assert _until_finished(
        c.submit_link_job([p, t], iq, name="part_1_of_2", options="--qairt_version 2.42")
    ).success
