"""Run reports: JSON against its schema, HTML5, PDF pages, failed runs, redaction, comparisons."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CANARY_TOKEN = "canary-aihub-tok-5f1e9d"
CANARY_PASSWORD = "canary-sudo-pw-77c3"
CANARY_SETTINGS = "canary-settings-pw-9d2"


@pytest.fixture(scope="module")
def chatted_run(compiled_sim_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run through chat and evaluate on the simulator board (the compile fixture plus board, chat and the
    Evaluate stage with its quickest suite, greedy parity)."""
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.pipeline import Pipeline
    from tests.support.sim_runs import copy_run

    run = copy_run(compiled_sim_run, tmp_path_factory.mktemp("chat-ws"))
    m = RunManifest.load(run)
    m.settings["eval_suites"] = ["greedy_parity"]
    m.save()
    res = asyncio.run(Pipeline(m).run(until="evaluate"))
    assert res.ok, (res.message, res.hint)
    return run


def _rewrite_artifact(run: Path, stage: str, rel: str, doc: dict[str, Any]) -> None:
    """Write `doc` as the stage's artifact `rel` and record its new size and digest, as the stage would have
    had it measured that (an edited file alone makes the stage out of date)."""
    from hexstudio.core.manifest import RunManifest
    from hexstudio.shared.bundle import sha256_file

    p = run / "artifacts" / stage / rel
    p.write_text(json.dumps(doc))
    m = RunManifest.load(run)
    for a in m.stage(stage).artifacts:
        if (run / a["path"]) == p:
            a.update(size=p.stat().st_size, sha256=sha256_file(p))
    m.save()


def _pdf_text(pdf: Path) -> str | None:
    """The PDF's text with all whitespace removed (a canary wrapped over two lines is still found); None where
    poppler-utils is missing (`./dev test` installs it; CI must have it), so the test's other checks still run."""
    if not shutil.which("pdftotext"):
        assert not os.environ.get("CI"), (
            "poppler-utils (pdftotext, pdftoppm) is missing on CI: apt-get install poppler-utils"
        )
        warnings.warn(
            "poppler-utils is not installed: PDF text checks left out (apt-get install poppler-utils)",
            stacklevel=2,
        )
        return None
    out = subprocess.run(
        ["pdftotext", str(pdf), "-"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "HexStudio" in out
    return "".join(out.split())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hexstudio", *args], capture_output=True, text=True, timeout=180, cwd=REPO
    )


def test_json_report_validates_and_labels_simulated_numbers(chatted_run: Path) -> None:
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.render import validate_report

    rep = build_report(chatted_run)
    validate_report(rep)
    # every stage before the report passed; the Report stage itself has not run, and the report says what the
    # dashboard and `runs show` say (one status model): not "complete" until it has
    assert rep["run"]["status"] == "in_progress" and rep["run"]["status_word"] == "8/9 stages passed"
    assert all(s["status"]["key"] == "passed" for s in rep["stages"] if s["name"] != "report")
    ev = rep["evaluation"]
    assert ev["simulated"] is True and ev["suites"][0]["suite"] == "greedy_parity"
    par = ev["suites"][0]["legs"]["board"]
    assert par["matched"] == par["total"] > 0
    assert rep["compile"]["simulated"] is True and rep["board"]["simulated"] is True
    kpis = {k["name"]: k for k in rep["kpis"]}
    assert set(kpis) == {
        "init_ms",
        "prompt_tokens",
        "prompt_tok_s",
        "ttft_ms",
        "generated_tokens",
        "gen_tok_s",
        "gen_time_ms",
    }
    assert all(k["source"] == "simulated" for k in kpis.values())
    assert kpis["gen_tok_s"]["value"] > 0 and kpis["gen_tok_s"]["reference"] == 10.03
    assert rep["validation"]["verdict"] == "pass" and rep["bundle"]["files"]
    assert rep["series"]["token_rate"] and "quantize" in rep["series"]["resources"]
    # each heavy stage's memory chart carries the preflight's estimate as its dashed line
    est = rep["model"]["estimates"]
    assert est["quantize_peak_rss_bytes"] > 0 and est["validate_peak_rss_bytes"] > 0
    assert [s["name"] for s in rep["stages"]][-1] == "report"
    # package versions against the recipe pins: this CPU stack differs from the validated GPU recipe, flagged
    from hexstudio.core.reports.render import to_html

    torch_row = next(p for p in rep["environment"]["recipes"] if p["package"] == "torch")
    assert torch_row["validated"]["pinned"].startswith("2.7.1") and torch_row["validated"]["match"] is False
    html = to_html(rep)
    assert re.search(r'<td class="warn">2\.7\.1[^<]* ≠</td>', html)
    assert f"preflight estimate {est['quantize_peak_rss_bytes'] / 1024**3:.2f} GiB" in html
    # the calibration-shape graph's own score sits beside the deployment pair's, and the known trap is named
    assert (
        rep["validation"]["calibration_graph"]["verdict"] == "pass"
        and "Calibration-shape graph alone" in html
    )
    rep["validation"]["verdict"] = "fail"
    assert "The calibration graph is fine but the deployment pair is broken" in to_html(rep)
    # the rate chart says what it counts: tokens when the chunks carry counts, else reads of the output
    assert rep["series"]["token_rate_unit"] == "tokens/s" and "Token rate during the benchmark reply" in html
    rep["series"]["token_rate_unit"] = "chunks/s"
    assert "Output rate (reads of the runner output, not tokens)" in to_html(rep)


def test_html_is_html5_and_pdf_renders_pages(chatted_run: Path, tmp_path: Path) -> None:
    import html5lib

    html_out, pdf_out = tmp_path / "r.html", tmp_path / "r.pdf"
    assert _cli("report", str(chatted_run), "--format", "html", "--out", str(html_out)).returncode == 0
    text = html_out.read_text()
    parser = html5lib.HTMLParser(strict=True)
    parser.parse(text)
    assert not parser.errors
    assert text.count("<svg") >= 2 and "SIMULATED" in text  # memory plots and the token-rate plot, inline
    low = text.lower()
    assert not any(
        ref in low for ref in ("<link", "<script", "<img", " src=", "url(", "@import")
    )  # self-contained
    assert low.count('<span class="badge simulated">simulated</span>') >= 7  # every KPI says it is simulated
    cmp_out = tmp_path / "c.html"
    cp = _cli(
        "report", "compare", str(chatted_run), str(chatted_run), "--format", "html", "--out", str(cmp_out)
    )
    assert cp.returncode == 0, cp.stderr
    parser = html5lib.HTMLParser(strict=True)
    parser.parse(cmp_out.read_text())
    assert not parser.errors
    out = _cli("report", str(chatted_run), "--format", "pdf", "--out", str(pdf_out))
    assert out.returncode == 0, out.stderr
    assert pdf_out.read_bytes()[:5] == b"%PDF-"
    pdf_text = _pdf_text(pdf_out)
    if pdf_text is not None:
        assert "SIMULATED" in pdf_text
        subprocess.run(
            ["pdftoppm", "-r", "40", "-png", str(pdf_out), str(tmp_path / "page")], check=True, timeout=120
        )
        pages = sorted(tmp_path.glob("page-*.png"))
        assert len(pages) >= 2 and all(p.stat().st_size > 2000 for p in pages)


def test_report_of_a_failed_run_says_where_why_and_what_next(chatted_run: Path, tmp_path: Path) -> None:
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.render import to_html, validate_report

    run = tmp_path / "failed"
    shutil.copytree(chatted_run, run)
    m = RunManifest.load(run)
    st = m.stage("board").data
    st["state"] = "failed"
    st["outcome"] = {
        "kind": "failed",
        "code": "board_unavailable",
        "message": "Cannot connect to 10.0.0.7:22: timed out.",
        "hint": "Is the board on, on the network, and running sshd?",
        "exit_code": None,
        "signal": None,
    }
    m.save()
    rep = build_report(run)
    validate_report(rep)
    f = rep["run"]["failure"]
    assert rep["run"]["status"] == "failed" and f["stage"] == "board" and f["code"] == "board_unavailable"
    assert "timed out" in f["message"] and "sshd" in f["hint"] and "doctor" in f["next_step"]
    html = to_html(rep)
    assert "Where it failed" in html and "Next step" in html


def test_canary_secrets_never_appear_in_any_format(
    chatted_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hexstudio.core.secrets import AIHUB_TOKEN, set_secret, sudo_password_key
    from hexstudio.core.settings import Settings

    run = tmp_path / "canary"
    shutil.copytree(chatted_run, run)
    set_secret(AIHUB_TOKEN, CANARY_TOKEN)
    s = Settings.load()
    s.boards["evk"] = {
        "host": "10.0.0.7",
        "user": "ubuntu",
        "auth": "key",
        "api_token": CANARY_TOKEN,
        "password": CANARY_SETTINGS,
    }
    s.save()
    set_secret(sudo_password_key("evk"), CANARY_PASSWORD)
    # canaries that leaked into the run's settings, its events and a stage log
    doc = json.loads((run / "run.json").read_text())
    doc["inputs"]["settings"]["aihub_token"] = CANARY_TOKEN
    doc["events"].append({"t": doc["created"], "kind": "note", "message": f"sudo -S with {CANARY_PASSWORD}"})
    doc["events"].append(
        {"t": doc["created"], "kind": "note", "message": f"ssh login with {CANARY_SETTINGS} ok"}
    )
    doc["stages"]["chat"]["warnings"] = [{"message": f"token {CANARY_TOKEN} seen"}]
    (run / "run.json").write_text(json.dumps(doc))
    log = run / "logs" / "board.jsonl"
    log.write_text(log.read_text() + json.dumps({"type": "log", "message": f"Bearer {CANARY_TOKEN}"}) + "\n")
    for fmt in ("json", "html", "pdf"):
        out = tmp_path / f"r.{fmt}"
        res = _cli("report", str(run), "--format", fmt, "--out", str(out))
        assert res.returncode == 0, res.stderr
        text = (_pdf_text(out) or "") if fmt == "pdf" else out.read_text()
        assert CANARY_TOKEN not in text and CANARY_PASSWORD not in text and CANARY_SETTINGS not in text, fmt
        assert "ssh login with" in text or fmt == "pdf"  # the event is there, without the secret
    res = _cli("report", "compare", str(run), str(chatted_run), "--format", "json")
    assert res.returncode == 0 and CANARY_TOKEN not in res.stdout and CANARY_PASSWORD not in res.stdout
    assert CANARY_SETTINGS not in res.stdout
    # the studio log these commands wrote (<config>/logs/studio.log) has none of them either
    from hexstudio.core.logs import log_path

    studio_log = log_path().read_text()
    assert "hexstudio report: started" in studio_log
    assert (
        CANARY_TOKEN not in studio_log
        and CANARY_PASSWORD not in studio_log
        and CANARY_SETTINGS not in studio_log
    )


def test_compare_keeps_boards_and_compile_targets_apart(chatted_run: Path, tmp_path: Path) -> None:
    """Like-for-like, also with host names hidden: two boards whose labels both read ssh://[user]@[host]:22
    are told apart by their names; a Compile on AI Hub is not set against a simulation bundle's, nor an Evaluate
    whose board leg ran on another board. A setting that differs is "changed", however small the difference
    (it is what was asked, not a measurement), and a CSV cell from run text never starts a formula."""
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.compare import compare_html, compare_reports
    from hexstudio.core.reports.noise import compare_csv

    def on_board(dest: Path, name: str) -> Path:
        shutil.copytree(chatted_run, dest)
        bj = dest / "artifacts" / "board" / "board.json"
        doc = json.loads(bj.read_text())
        doc.update({"board": name, "label": f"ssh://root@{name}:22", "simulated": False})
        _rewrite_artifact(dest, "board", "board.json", doc)
        return dest

    a, b = on_board(tmp_path / "a", "evk-a"), on_board(tmp_path / "b", "evk-b")
    m = RunManifest.load(b)
    m.settings.update({"calibration_samples": 505, "benchmark_prompt": '=HYPERLINK("http://x","hi")'})
    m.save()
    ma = RunManifest.load(a)
    ma.settings.update({"calibration_samples": 500})
    ma.save()
    ra, rb = build_report(a, redact_hosts=True), build_report(b, redact_hosts=True)
    assert ra["board"]["label"] == rb["board"]["label"], "both labels hidden alike"
    c = compare_reports([ra, rb])
    labels = {r["label"] for r in c["rows"]}
    for stage in ("Board", "Chat", "Compile", "Evaluate"):
        assert f"{stage} duration" not in labels, stage
        assert any(x.startswith(f"{stage} duration and memory") for x in c["skipped"]), stage
    # and the reason names no host
    assert not any("evk-" in x for x in c["skipped"]), c["skipped"]
    assert "Quantize duration" in labels
    rows = {(r["section"], r["name"]): r for r in c["rows"]}
    # 505 against 500 is within the ±2 % a measurement is allowed, but a setting is not a measurement
    assert rows[("settings", "calibration_samples")]["values"] == [500, 505]
    assert rows[("settings", "calibration_samples")]["judgement"] == ["changed"]
    assert rows[("settings", "benchmark_prompt")]["judgement"] == ["changed"]
    csv_text = compare_csv(c)
    assert "'=HYPERLINK" in csv_text and ",=HYPERLINK" not in csv_text and '"=HYPERLINK' not in csv_text
    # b's benchmark prompt changed after its chat: its KPIs are out of date, and left out
    assert any(x.startswith("Chat KPIs: out of date in") for x in c["skipped"]), c["skipped"]
    # each run's source travels with its figure: the CSV dropped it, so a simulator's tok/s read as a device's
    same = compare_reports([ra, build_report(on_board(tmp_path / "a2", "evk-a"), redact_hosts=True)])
    lines = list(csv.reader(io.StringIO(compare_csv(same))))
    assert lines[0][-2:] == [f"{r['run_id']} source" for r in same["runs"]]
    gen = next(x for x in lines if x[0] == "kpis" and x[1] == "Generation")
    assert gen[-2:] == ["simulated", "simulated"], gen
    # one board, a Compile on AI Hub against the simulation bundle's
    c2 = on_board(tmp_path / "c2", "evk-a")
    cj = c2 / "artifacts" / "compile" / "compile.json"
    doc = json.loads(cj.read_text()) if cj.is_file() else {}
    cj.write_text(json.dumps({**doc, "target": "aihub"}))
    c = compare_reports([build_report(a, redact_hosts=True), build_report(c2, redact_hosts=True)])
    labels = {r["label"] for r in c["rows"]}
    assert "Compile duration" not in labels and "Board duration" in labels and "Evaluate duration" in labels
    # an emulated compile is said so in the compare's header
    bj = c2 / "artifacts" / "compile" / "bundle" / "bundle.json"
    bj.write_text(json.dumps({**json.loads(bj.read_text()), "emulated": True}))
    c = compare_reports([build_report(a, redact_hosts=True), build_report(c2, redact_hosts=True)])
    assert [r["emulated"] for r in c["runs"]] == [False, True]
    assert "EMULATED compile" in compare_html(c)
    assert any(x.startswith("Compile duration and memory") and "aihub" in x for x in c["skipped"]), c[
        "skipped"
    ]


def test_a_simulator_board_is_said_so_whatever_compiled_the_bundle(chatted_run: Path, tmp_path: Path) -> None:
    """Real QNN binaries compiled on this PC (compile_target local) make a bundle that is not "simulated", yet
    they ran on Qualcomm's x86 HTP simulator: the report had no SIMULATED banner, Compare no badge, and the
    Compile section said "Qualcomm AI Hub"."""
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.compare import compare_html, compare_reports
    from hexstudio.core.reports.render import to_html

    run = tmp_path / "local"
    shutil.copytree(chatted_run, run)
    bj = run / "artifacts" / "compile" / "bundle" / "bundle.json"
    bj.write_text(json.dumps({**json.loads(bj.read_text()), "simulated": False, "compile_target": "local"}))
    rep = build_report(run)
    assert rep["compile"]["simulated"] is False and rep["board"]["simulated"] is True
    assert rep["simulated_board"] is True
    page = to_html(rep)
    assert "SIMULATED board: numbers are not device results" in page
    assert "Qualcomm QNN on this PC" in page and ">Qualcomm AI Hub<" not in page
    c = compare_reports([build_report(chatted_run), rep])
    assert [r["simulated"] for r in c["runs"]] == [True, True] and "SIMULATED board" in compare_html(c)


def test_out_of_date_chat_figures_are_said_so_and_left_out_of_compare(
    chatted_run: Path, tmp_path: Path
) -> None:
    """After a setting the Chat stage reads changed (or a new bundle was pushed), the stage went stale, yet the
    report showed its old KPIs as the run's, and Compare set them beside another run's."""
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.compare import compare_reports
    from hexstudio.core.reports.render import to_html
    from hexstudio.core.stages import get_stage

    run = tmp_path / "changed"
    shutil.copytree(chatted_run, run)
    m = RunManifest.load(run)
    key = next(k for k in get_stage("chat").inputs if k in m.settings and isinstance(m.settings[k], str))
    m.settings[key] = str(m.settings[key]) + " changed"
    m.save()
    rep = build_report(run)
    assert rep["chat"]["stale"] is True and rep["kpis"]
    assert "Out of date:</b> the run changed after the Chat stage ran" in to_html(rep)
    c = compare_reports([build_report(chatted_run), rep])
    assert not any(r["section"] == "kpis" for r in c["rows"])
    assert any(x.startswith("Chat KPIs: out of date in") for x in c["skipped"]), c["skipped"]
    assert build_report(chatted_run)["chat"]["stale"] is False


def test_host_names_are_left_out_when_asked(chatted_run: Path) -> None:
    from hexstudio.core.reports.collect import build_report

    host = json.loads((chatted_run / "run.json").read_text())["environment"]["host"]
    assert build_report(chatted_run)["environment"]["host"] == host
    rep = build_report(chatted_run, redact_hosts=True)
    assert rep["environment"]["host"] == "[host]"


def test_an_out_suffix_no_format_has_is_refused(chatted_run: Path, tmp_path: Path) -> None:
    """`--out report.md` wrote HTML into report.md with exit status 0 (there is no Markdown export); .htm is
    HTML, and --format decides whatever the name."""
    res = _cli("report", str(chatted_run), "--out", str(tmp_path / "report.md"))
    assert res.returncode == 2 and "not .md" in res.stderr and not (tmp_path / "report.md").exists(), (
        res.stderr
    )
    assert _cli("report", str(chatted_run), "--out", str(tmp_path / "r.htm")).returncode == 0
    assert (tmp_path / "r.htm").read_text().lstrip().lower().startswith("<!doctype html")
    assert (
        _cli("report", str(chatted_run), "--format", "json", "--out", str(tmp_path / "r.txt")).returncode == 0
    )


def test_a_worker_hosts_names_are_left_out_too(chatted_run: Path, tmp_path: Path) -> None:
    """A stage that failed on a worker host names it ("Worker host 'gpu1' (alice@10.2.3.4:22) has not been
    trusted"): --redact-hosts hid this machine and the board, and left the worker host's user and address."""
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.remote.hosts import worker_hosts
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.settings import Settings

    run = tmp_path / "run"
    shutil.copytree(chatted_run, run)
    s = Settings.load()
    worker_hosts(s)["gpu1"] = {"host": "10.2.3.4", "user": "alice", "port": 22}
    s.save()
    m = RunManifest.load(run)
    m.settings["worker_host"] = "gpu1"
    m.stage("quantize").data["outcome"] = {
        "kind": "failed",
        "message": "Worker host 'gpu1' (alice@10.2.3.4:22) has not been trusted yet.",
        "hint": "Try ssh -p 22 alice@10.2.3.4",
    }
    m.save()
    text = json.dumps(build_report(run, redact_hosts=True))
    assert "10.2.3.4" not in text and "alice" not in text, text[text.find("Worker host") :][:200]
    assert "10.2.3.4" in json.dumps(build_report(run))  # only when asked


def test_a_nan_metric_leaves_the_report_valid_json(chatted_run: Path, tmp_path: Path) -> None:
    """A broken quantization gives NaN logits, so a KL divergence of NaN: json.dumps wrote a bare NaN, and
    `hexstudio report RUN | jq .` (and the report.json a browser reads) refused the document."""
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.reports.collect import build_report

    run = tmp_path / "run"
    shutil.copytree(chatted_run, run)
    v = json.loads((run / "artifacts" / "validate" / "validation.json").read_text())
    v["checks"] = {**(v.get("checks") or {}), "kl_divergence": {"value": float("nan"), "ok": False}}
    _rewrite_artifact(run, "validate", "validation.json", v)
    m = RunManifest.load(run)
    m.stage("validate").data["metrics"]["kl_divergence"] = {"value": float("nan"), "unit": ""}
    m.save()
    rep = build_report(run)
    assert "kl_divergence" in json.dumps(rep["validation"]["checks"])
    text = json.dumps(rep, allow_nan=False)  # raises on a NaN or an infinity
    assert "NaN" not in text and "Infinity" not in text


def test_compare_side_by_side_and_refusal(chatted_run: Path, tmp_path: Path, validated_run: Path) -> None:
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.compare import compare_html, compare_reports
    from hexstudio.core.reports.render import ReportError

    other = tmp_path / "other"
    shutil.copytree(chatted_run, other)
    m = RunManifest.load(other)
    m.stage("chat").data["duration_s"] = float(m.stage("chat").data["duration_s"]) * 2
    m.save()
    chat = json.loads((other / "artifacts" / "chat" / "chat.json").read_text())
    chat["kpis"]["gen_tok_s"] = chat["kpis"]["gen_tok_s"] * 0.5
    _rewrite_artifact(other, "chat", "chat.json", chat)
    c = compare_reports([build_report(chatted_run), build_report(other)])
    rows = {(r["section"], r["name"]): r for r in c["rows"]}
    gen = rows[("kpis", "gen_tok_s")]
    assert gen["judgement"] == ["worse"] and gen["deltas"][0] == pytest.approx(-0.5, abs=0.01)
    assert gen["sources"] == ["simulated", "simulated"]
    assert ("validation", "top1_agreement") in rows
    assert '<td class="worse">' in compare_html(c)
    # a device run's KPIs are not set against simulated ones: left out, and the comparison says why
    dev = tmp_path / "device"
    shutil.copytree(other, dev)
    chat["source"] = chat["kpis"]["source"] = "device"
    _rewrite_artifact(dev, "chat", "chat.json", chat)
    c3 = compare_reports([build_report(chatted_run), build_report(dev)])
    assert not any(r["section"] == "kpis" for r in c3["rows"])
    assert any("different kinds of board" in x for x in c3["skipped"]) and "Left out" in compare_html(c3)
    # nor the chat stage's duration: it ran on a different kind of board (like-for-like rows only)
    assert not any(r["label"] == "Chat duration" for r in c3["rows"])
    assert any(
        x.startswith("Chat duration and memory: the runs ran this stage on different machines")
        for x in c3["skipped"]
    )
    assert any(r["label"] == "Quantize duration" for r in c3["rows"])  # same workstation: still compared
    # a quantize peak on another workstation is not set against this one's
    far = tmp_path / "far"
    shutil.copytree(chatted_run, far)
    m = RunManifest.load(far)
    m.data["environment"] = {
        **m.data["environment"],
        "cpu_count": 64,
        "memory_bytes": 256 * 1024**3,
        "gpus": [{"name": "NVIDIA GeForce RTX 5090"}],
    }
    m.save()
    c4 = compare_reports([build_report(chatted_run), build_report(far)])
    assert not any(r["label"].startswith("Quantize") for r in c4["rows"])
    assert any("Quantize duration and memory" in x and "RTX 5090" in x for x in c4["skipped"])
    assert any(r["section"] == "kpis" for r in c4["rows"])  # the same simulator board: KPIs still compared
    # a validated run and a chatted run share the validation metrics: comparable, like-for-like only
    c2 = compare_reports([build_report(validated_run), build_report(chatted_run)])
    assert not any(r["section"] == "kpis" for r in c2["rows"])
    # a run that only made its model stage has nothing in common with one that did not start
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(chatted_run, a)
    shutil.copytree(chatted_run, b)
    for run, keep in ((a, {"model"}), (b, set())):
        m = RunManifest.load(run)
        for name in ("model", "preflight", "quantize", "validate", "compile", "board", "chat", "evaluate"):
            if name not in keep:
                m.stage(name).data.update({"state": "pending", "outcome": None})
        m.save()
        shutil.rmtree(run / "artifacts")
    with pytest.raises(ReportError, match="nothing in common"):
        compare_reports([build_report(a), build_report(b)])
    res = _cli("report", "compare", str(a), str(b), "--format", "json")
    assert res.returncode != 0 and "nothing in common" in res.stderr


def test_report_stage_writes_html_and_json(chatted_run: Path, tmp_path: Path) -> None:
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.reports.render import validate_report

    run = tmp_path / "staged"
    shutil.copytree(chatted_run, run)
    res = asyncio.run(Pipeline(RunManifest.load(run)).run(until="report"))
    assert res.ok, (res.message, res.hint)
    rep: dict[str, Any] = json.loads((run / "artifacts" / "report" / "report.json").read_text())
    validate_report(rep)
    assert (run / "artifacts" / "report" / "report.html").stat().st_size > 2000
    assert rep["environment"]["host"] == "[host]"  # host names stay out unless the settings say otherwise


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_real_board_failure_is_reported_with_where_why_next_and_no_secrets(
    chatted_run: Path, tmp_path: Path
) -> None:
    """The Board stage really fails (nothing listens on the board's port); the Report stage still runs."""
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.reports.render import to_html, validate_report
    from hexstudio.core.secrets import board_password_key, set_secret, sudo_password_key
    from hexstudio.core.settings import Settings

    run = tmp_path / "ws" / "runs" / chatted_run.name
    shutil.copytree(chatted_run, run)
    s = Settings.load()
    s.boards["evk"] = {"host": "127.0.0.1", "port": _closed_port(), "user": "qcsuser", "auth": "password"}
    s.save()
    set_secret(board_password_key("evk"), CANARY_PASSWORD)
    set_secret(sudo_password_key("evk"), CANARY_PASSWORD + "-sudo")
    doc = json.loads((run / "run.json").read_text())
    doc["inputs"]["board"] = "evk"
    (run / "run.json").write_text(json.dumps(doc))
    res = asyncio.run(Pipeline(RunManifest.load(run)).run(only="board"))
    assert not res.ok and res.stopped_at == "board"
    res = asyncio.run(Pipeline(RunManifest.load(run)).run(only="report"))
    assert res.ok, (res.message, res.hint)
    rep = json.loads((run / "artifacts" / "report" / "report.json").read_text())
    validate_report(rep)
    f = rep["run"]["failure"]
    assert rep["run"]["status"] == "failed" and f["stage"] == "board" and f["code"] == "board_unavailable"
    assert f["message"] and f["hint"] and "doctor" in f["next_step"]
    html = (run / "artifacts" / "report" / "report.html").read_text()
    assert "Where it failed" in html and "board_unavailable" in html and "Next step" in html
    assert to_html(rep).count("Where it failed") == 1
    # host and user names stay out by default (include_host_in_reports is off); secrets never appear
    for text in (json.dumps(rep), html):
        assert "127.0.0.1" not in text and "qcsuser" not in text
        assert CANARY_PASSWORD not in text
    # the command line, by run id in its workspace, in every format
    for fmt in ("json", "html", "pdf"):
        out = tmp_path / f"failed.{fmt}"
        cp = _cli("report", run.name, "--workspace", str(tmp_path / "ws"), "--format", fmt, "--out", str(out))
        assert cp.returncode == 0, cp.stderr
        assert "run failed" in cp.stderr
    pdf_text = _pdf_text(tmp_path / "failed.pdf")
    assert pdf_text is None or (
        "Whereitfailed" in pdf_text and CANARY_PASSWORD not in pdf_text and "127.0.0.1" not in pdf_text
    )
    cp = _cli("report", run.name, "--workspace", str(tmp_path / "ws"), "--include-hosts", "--format", "json")
    assert cp.returncode == 0 and "127.0.0.1" in cp.stdout and CANARY_PASSWORD not in cp.stdout


def test_a_failed_compile_lists_its_ai_hub_jobs_and_reasons(chatted_run: Path, tmp_path: Path) -> None:
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.render import to_html, validate_report

    run = tmp_path / "compile-failed"
    shutil.copytree(chatted_run, run)
    m = RunManifest.load(run)
    for name in ("compile", "board", "chat"):
        m.stage(name).data.update({"state": "pending", "outcome": None, "gate": None})
    m.stage("compile").data.update(
        {
            "state": "failed",
            "outcome": {
                "kind": "failed",
                "code": "aihub_job_failed",
                "message": "AI Hub compile job jq1 (part 2) failed: Out of memory on the target.",
                "hint": "Split the model in more parts.",
                "exit_code": 2,
                "signal": None,
            },
        }
    )
    m.save()
    shutil.rmtree(run / "artifacts" / "compile")
    job = {
        "part": 1,
        "kind": "compile",
        "graph": "prompt_ar128_cl512_1_of_2",
        "job_id": "jp0",
        "url": "https://app.aihub.qualcomm.com/jobs/jp0",
        "state": "SUCCESS",
    }
    failed = {
        **job,
        "part": 2,
        "graph": "prompt_ar128_cl512_2_of_2",
        "job_id": "jq1",
        "state": "FAILED",
        "reason": "Out of memory on the target.",
    }
    (run / "aihub_jobs.json").write_text(
        json.dumps({"version": 1, "key": "k", "jobs": {"a": job}, "failed": [failed]})
    )
    rep = build_report(run)
    validate_report(rep)
    assert rep["run"]["failure"]["stage"] == "compile" and "resume" in rep["run"]["failure"]["next_step"]
    assert [j["job_id"] for j in rep["compile"]["jobs"]] == ["jp0"]
    assert rep["compile"]["failed_jobs"][0]["reason"] == "Out of memory on the target."
    # an earlier attempt's chat.json and board.json are still on disk, but they belong to stages not done now
    assert rep["bundle"] is None and rep["kpis"] == [] and rep["chat"] is None and rep["board"] is None
    html = to_html(rep)
    assert "jq1" in html and "Failed AI Hub jobs" in html


def test_secret_key_names_and_redaction_rules() -> None:
    from hexstudio.core.reports.redact import REDACTED, is_secret_key, scrub

    assert all(
        is_secret_key(k)
        for k in (
            "api_token",
            "aihub_token",
            "sudo_password",
            "clientSecret",
            "api-key",
            "apiKey",
            "hf_token",
            "Authorization",
        )
    )
    assert not any(
        is_secret_key(k)
        for k in (
            "prompt_tokens",
            "generated_tokens",
            "tokenizer",
            "bos_token",
            "eos_token_ids",
            "max_new_tokens",
            "key_path",
            "token_rate_unit",
            "token_count",
        )
    )
    out = scrub(
        {
            "api_token": "abc",
            "note": "first token: 12 ms; Bearer xyz987; password=hunter22",
            "path": "/home/alice/ws on buildbox",
            "n": 3,
            "kv": ["alice-2", "buildbox.lan"],
            "msg": "s3cr3t-value inside",
        },
        ["s3cr3t-value"],
        ["buildbox"],
        ["alice"],
    )
    assert out["api_token"] == REDACTED and out["n"] == 3
    assert out["note"] == f"first token: 12 ms; Bearer {REDACTED}; password={REDACTED}"
    assert out["path"] == "/home/[user]/ws on [host]" and out["kv"] == ["alice-2", "[host].lan"]
    assert out["msg"] == f"{REDACTED} inside"


def test_interactive_chat_sessions_are_in_the_report(chatted_run: Path, tmp_path: Path) -> None:
    """Turns chatted on the run's bundle (Chat page, `hexstudio chat`) are kept in the run and reported,
    each with its KPIs and source; a torn last line (a killed studio) is skipped."""
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.render import to_html, validate_report

    run = tmp_path / "chatted"
    shutil.copytree(chatted_run, run)
    kpis = {
        "init_ms": 812.0,
        "prompt_tokens": 30,
        "prompt_tok_s": 120.5,
        "ttft_ms": 250.0,
        "generated_tokens": 20,
        "gen_tok_s": 12.5,
        "gen_time_ms": 1600.0,
        "source": "simulated",
        "queries": 1,
        "origin": "profile",
    }
    lines = [
        {
            "type": "session",
            "started": "2026-11-23T05:00:00Z",
            "board": "sim",
            "board_label": "simulator",
            "mode": "persistent",
            "template": "llama3",
            "sampler": "deterministic",
        }
    ]
    for n, (ttft, rate) in enumerate(((250.0, 12.5), (90.0, 13.5), (100.0, 14.5)), start=1):
        lines.append(
            {
                "type": "turn",
                "n": n,
                "state": "complete",
                "mode": "persistent",
                "source": "simulated",
                "kpis": {**kpis, "ttft_ms": ttft, "gen_tok_s": rate, "init_ms": 812.0 if n == 1 else None},
                "user": f"question {n} " + "x" * 100,
                "reply": "an answer",
            }
        )
    (run / "chats").mkdir()
    (run / "chats" / "20261123-050000-1-0001.jsonl").write_text(
        "\n".join(json.dumps(x) for x in lines) + '\n{"type": "turn", "n": 4, "sta'
    )
    rep = build_report(run)
    validate_report(rep)
    (s,) = rep["chat_sessions"]
    assert [t["n"] for t in s["turns"]] == [1, 2, 3] and s["source"] == "simulated"
    assert s["median_ttft_ms"] == 100.0 and s["median_gen_tok_s"] == 13.5
    assert len(s["turns"][0]["user"]) == 80 and s["turns"][0]["user"].endswith("...")
    html = to_html(rep)
    assert (
        "<h2>Chat sessions</h2>" in html and "kept loaded" in html and "median generation 13.50 tok/s" in html
    )


def _bench_doc(ttfts: list[float], source: str = "simulated") -> dict[str, Any]:
    """A `hexstudio bench` result from a runner with known timings (tests/genie/test_bench.py's)."""
    from hexstudio.core.genie.bench import BenchPlan, run_bench
    from tests.genie.test_bench import KnownRunner

    r = KnownRunner("genie", ttfts, warmup=1)
    r.simulated = source == "simulated"

    async def make() -> KnownRunner:
        return r

    doc = asyncio.run(
        run_bench(
            [make],
            BenchPlan(
                prompt_lengths=(10, 50),
                context_fills=(0.0, 0.5),
                warmup=1,
                runs=3,
                gen_tokens=20,
                init_runs=2,
            ),
        )
    )
    doc["board"], doc["board_label"] = "sim", "simulator board"
    return doc


def test_bench_results_in_the_report_and_in_compare(chatted_run: Path, tmp_path: Path) -> None:
    """`hexstudio bench` stored in a run: its medians, spreads and published figures in the report (tables and
    plots, labeled simulated / published), and its medians as Compare rows, judged; a device bench is never
    set against a simulated one."""
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.compare import compare_html, compare_reports
    from hexstudio.core.reports.render import to_html, validate_report

    runs = []
    for name, ttfts in (("fast", [100.0, 140.0, 120.0]), ("slow", [200.0, 280.0, 240.0])):
        run = tmp_path / name
        shutil.copytree(chatted_run, run)
        (run / "artifacts" / "bench").mkdir(parents=True, exist_ok=True)
        (run / "artifacts" / "bench" / "bench.json").write_text(json.dumps(_bench_doc(ttfts)))
        runs.append(run)
    rep = build_report(runs[0])
    validate_report(rep)
    (rt,) = rep["bench"]["runtimes"]
    assert rt["runtime"] == "genie" and rt["source"] == "simulated" and rt["init_ms"]["median"] == 1000.0
    cell = rt["cells"][0]
    assert (cell["prompt_tokens"], cell["fill_tokens"]) == (10, 0)
    assert cell["ttft_ms"]["median"] == 120.0 and cell["ttft_ms"]["stdev"] == pytest.approx(20.0)
    assert (cell["ttft_ms"]["min"], cell["ttft_ms"]["max"], cell["ttft_ms"]["n"]) == (100.0, 140.0, 3)
    html = to_html(rep)
    assert "<code>hexstudio bench</code> on simulator board" in html
    assert "SIMULATED (CPU, not a device result)" in html and "120.00 ± 20.00" in html
    assert "Benchmark decode (median, simulated)" in html and "Benchmark TTFT (median, simulated)" in html
    assert "not measured here" in html and 'class="badge reference">published' in html
    assert "qai_hub_models/models/llama_v3_1_8b_instruct/perf.yaml" in html and "facts/" not in html
    # Compare: the slow run's TTFT is twice the fast one's, its decode rate half
    c = compare_reports([build_report(runs[0]), build_report(runs[1])])
    rows = {r["label"]: r for r in c["rows"] if r["section"] == "bench"}
    ttft = rows["genie TTFT, prompt 10 fill 0 (median)"]
    assert (
        ttft["values"] == [120.0, 240.0]
        and ttft["judgement"] == ["worse"]
        and ttft["sources"] == ["simulated"] * 2
    )
    dec = rows["genie decode, prompt 50 fill 500 (median)"]
    assert dec["deltas"][0] == pytest.approx(-0.5, abs=1e-3) and dec["judgement"] == ["worse"]
    assert rows["genie init (median)"]["judgement"] == ["same"]
    assert "Benchmark (hexstudio bench, medians)" in compare_html(c)
    # a device bench is not set against a simulated one, and the comparison says why
    (runs[1] / "artifacts" / "bench" / "bench.json").write_text(
        json.dumps(_bench_doc([200.0, 280.0, 240.0], source="device"))
    )
    c2 = compare_reports([build_report(runs[0]), build_report(runs[1])])
    assert not any(r["section"] == "bench" for r in c2["rows"])
    assert any("Benchmark genie" in s and "different kinds of board" in s for s in c2["skipped"])


def test_a_speculative_board_dialog_shows_its_acceptance_labeled(chatted_run: Path) -> None:
    """Issue 29: the report names the board's speculative dialog and Genie's tokens accepted per step over the
    user's own cases, labeled simulated where the board is the simulator."""
    import copy

    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.render import to_html, validate_report

    rep = copy.deepcopy(build_report(chatted_run))
    assert "speculative" not in to_html(rep)  # a basic dialog: nothing said
    rep["evaluation"]["board_session"] = {
        **(rep["evaluation"].get("board_session") or {}),
        "dialog": "spd",
        "accepted_per_step": 3.667,
        "accepted_per_step_cases": 3,
    }
    validate_report(rep)
    html = to_html(rep)
    m = re.search(r'<p id="speculative">(.*?)</p>', html, re.S)
    assert m is not None
    text = re.sub(r"<[^>]+>", "", m.group(1))
    assert "spd" in text and "3.67 tokens accepted per step" in text and "3 of your cases" in text
    assert "SIMULATED" in text  # the chatted run's board is the simulator
    assert "Genie's token-acceptance-rate" in text
    # lade on Genie 1.21: no profile for a reply cut at max_tokens, the figure is estimated and says so
    rep["evaluation"]["board_session"].update(
        dialog="lade", accepted_per_step=1.375, accepted_per_step_source="token times"
    )
    validate_report(rep)
    m = re.search(r'<p id="speculative">(.*?)</p>', to_html(rep), re.S)
    assert m is not None
    text = re.sub(r"<[^>]+>", "", m.group(1))
    assert "1.38 tokens accepted per step" in text and "estimated from when each token arrived" in text
    assert "Genie's token-acceptance-rate" not in text


def test_compare_sets_suite_scores_side_by_side_only_for_the_same_cases() -> None:
    """`report compare` judged a suite's scores better or worse between runs that scored different versions of
    the suite (`eval add --replace` between them) or different cases of it (an HTP-simulator board scores only
    the first parity cases), with nothing under "skipped"."""
    from hexstudio.core.reports.compare import _evaluation_rows

    def report(sha: str, board_cases: int, value: float) -> dict[str, Any]:
        legs = {
            "sim": {"value": 0.9, "cases": 12, "of": 12},
            "htp": {"value": 0.85, "cases": 12, "of": 12},  # left out of the comparison before
            "board": {"value": value, "cases": board_cases, "of": 12},
        }
        suites = [
            {"suite": "mine", "scorer": "exact", "sha256": sha, "legs": legs},
            {"suite": "greedy_parity", "scorer": "parity", "sha256": "p", "legs": legs},
        ]
        return {"evaluation": {"source": "simulated", "suites": suites}}

    skipped: list[str] = []
    rows, _bars = _evaluation_rows([report("a", 12, 1.0), report("b", 3, 0.8)], skipped)
    labels = [r["label"] for r in rows]
    assert labels == ["greedy_parity · sim", "greedy_parity · htp"], labels
    assert any("mine: the runs scored different versions of the suite" in s for s in skipped), skipped
    assert any(
        "greedy_parity · board: the runs scored different cases (12 of 12, 3 of 12)" in s for s in skipped
    )
    # a leg one run did not score is not a "different cases" line: the report sets only what every run has
    third = report("a", 12, 1.0)
    for t in third["evaluation"]["suites"]:
        t["legs"] = {k: v for k, v in t["legs"].items() if k != "htp"}
    skipped = []
    rows, _bars = _evaluation_rows([report("a", 12, 1.0), report("b", 3, 0.8), third], skipped)
    assert not any("· htp" in s for s in skipped) and "greedy_parity · htp" not in [r["label"] for r in rows]
