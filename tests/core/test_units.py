"""Issue 32: rates printed with 4 decimals (CLI and GUI). One formatter (hexstudio/core/units.py) prints every
rate and time the faces show: tok/s with 2 decimals below 10, 1 below 1,000; ms whole above 10."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from hexstudio.core.genie.bench import report_text
from hexstudio.core.genie.conversation import Turn
from hexstudio.core.genie.profile import Kpis
from hexstudio.core.genie.session import TurnResult
from hexstudio.core.units import fmt_ms, fmt_quantity, fmt_rate

FOUR_DECIMALS = re.compile(r"\d\.\d{3,}")


@pytest.mark.parametrize(
    ("v", "text"),
    [
        (16.4321, "16.4"),
        (7.9312, "7.93"),
        (948.2871, "948.3"),
        (1204.5, "1,204"),
        (0.0312, "0.03"),
        (None, "—"),
        ("x", "—"),
        (float("nan"), "—"),
        (12, "12.0"),
    ],
)
def test_rates(v: object, text: str) -> None:
    assert fmt_rate(v) == text


def test_times_and_units() -> None:
    assert fmt_ms(183.5123) == "184" and fmt_ms(3.214) == "3.2" and fmt_ms(12_345.6) == "12,346"
    assert fmt_rate(16.43, "tok/s") == "16.4 tok/s" and fmt_rate(None, "tok/s") == "—"
    assert fmt_quantity(16.4321, "tok/s") == "16.4 tok/s" and fmt_quantity(183.51, "ms") == "184 ms"
    assert fmt_quantity(3, "tokens") is None


KPIS = Kpis(
    init_ms=1234.5678,
    prompt_tokens=29,
    prompt_tok_s=158.0345,
    ttft_ms=183.5234,
    generated_tokens=32,
    gen_tok_s=9.5012,
    gen_time_ms=3368.1234,
    source="simulated",
)


def test_cli_chat_kpi_line() -> None:
    from hexstudio.cli.chat_cmd import _kpi_line

    r = TurnResult(
        turn=Turn(user="hi"),
        text="hello",
        state="complete",
        kpis=KPIS,
        chunks=[],
        mode="per_turn",
        simulated=True,
        first_chunk_ms=1.0,
        wall_ms=2.0,
    )
    line = _kpi_line(r)
    assert (
        "TTFT 184 ms" in line
        and "at 158.0 tok/s" in line
        and "at 9.50 tok/s" in line
        and "init 1,235 ms" in line
    )
    assert not FOUR_DECIMALS.search(line), line


def test_cli_genie_profile_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hexstudio.cli import genie_cmd

    monkeypatch.setattr(genie_cmd, "parse_profile", lambda _text: KPIS)
    f = tmp_path / "profile.json"
    f.write_text("{}")
    genie_cmd.cmd_profile(argparse.Namespace(file=str(f), json=False))
    out = capsys.readouterr().out
    assert "9.50 tok/s" in out and "158.0 tok/s" in out and "184 ms" in out
    assert not FOUR_DECIMALS.search(out), out


def test_bench_report_text() -> None:
    cell_stats = {
        "ttft_ms": {"median": 183.5234, "stdev": 4.1234},
        "prompt_tok_s": {"median": 158.0345, "stdev": 2.5},
        "gen_tok_s": {"median": 9.5012, "stdev": 0.0423},
    }
    doc = {
        "runtimes": [
            {
                "runtime": "genie",
                "runtime_version": "1.21",
                "simulated": True,
                "init_ms": {"median": 1234.5678, "stdev": 12.3456, "n": 2},
                "cells": [{"prompt_tokens": 32, "fill_tokens": 0, "stats": cell_stats}],
            }
        ],
        "published": [],
    }
    text = report_text(doc)
    assert "9.50 ± 0.04" in text and "184 ± 4.1" in text and "1,235 ms" in text
    assert not FOUR_DECIMALS.search(text), text


def test_gui_kpi_line_and_tables() -> None:
    pytest.importorskip("PySide6")
    from hexstudio.core.services.chat import kpi_line
    from hexstudio.ui.widgets import fmt_value

    line = kpi_line(KPIS.as_json())
    assert "generation 9.50 tok/s" in line and "prompt 158.0 tok/s" in line and "TTFT 184 ms" in line
    assert fmt_value(16.4321, "tok/s") == "16.4 tok/s" and fmt_value(183.5234, "ms") == "184 ms"
