"""Suites: the shipped ones load; a bad file is refused naming its line; `hexstudio eval add`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexstudio.cli.main import main
from hexstudio.core.eval.scoring import check, large_drop, parity, suite_scores
from hexstudio.core.eval.suites import DEFAULT_SUITES, SuiteError, add_suite, available, load_suite


def test_shipped_suites_load() -> None:
    found = available(None)
    for name in DEFAULT_SUITES:
        s = load_suite(found[name])
        assert s.cases and s.name == name


@pytest.mark.parametrize(
    "line,what",
    [
        ("{not json", "not valid JSON"),
        ('{"prompt": "x", "scorer": "nope"}', "unknown scorer"),
        ('{"prompt": "x", "scorer": "tool_call", "expected": {"abstain": true}}', 'needs "tools"'),
        (
            '{"prompt": "x", "scorer": "tool_call", "tools": [{"type": "function", "function": {"name": "a"}}], '
            '"expected": {"calls": [{"name": "b"}]}}',
            "not among the case's tools",
        ),
        # an expected call its tool's schema refuses could never be scored right
        (
            '{"prompt": "x", "scorer": "tool_call", "tools": [{"type": "function", "function": {"name": "a", '
            '"parameters": {"properties": {"city": {}}}}}], "expected": {"calls": [{"name": "a", "arguments": '
            '{"town": "Lyon"}}]}}',
            "passes 'town', which is not among the tool's parameters (city)",
        ),
        (
            '{"prompt": "x", "scorer": "tool_call", "tools": [{"type": "function", "function": {"name": "a", '
            '"parameters": {"properties": {"city": {}, "days": {}}, "required": ["city"]}}}], '
            '"expected": {"calls": [{"name": "a", "arguments": {"days": 2}}]}}',
            "leaves out 'city', which the tool requires",
        ),
        (
            '{"prompt": "x", "scorer": "tool_call", "tools": [{"type": "function", "function": {"name": "a", '
            '"parameters": {"properties": 5}}}], "expected": {"abstain": true}}',
            '"properties" must be an object',
        ),
        ('{"prompt": "x", "scorer": "instruction", "checks": [{"type": "rhyme"}]}', "unknown check"),
        # a check without what it reads was accepted, then scored every case wrong
        ('{"prompt": "x", "scorer": "instruction", "checks": [{"type": "max_words"}]}', 'needs "n"'),
        (
            '{"prompt": "x", "scorer": "instruction", "checks": [{"type": "contains", "value": "y"}]}',
            'needs "text"',
        ),
        (
            '{"prompt": "x", "scorer": "tool_call", "tools": [{"type": "function", "function": {"name": "a"}}], '
            '"expected": {"calls": [{"name": "a", "arguments": "x=1"}]}}',
            "expects",
        ),
        ('{"scorer": "exact"}', 'needs "prompt"'),
        # a NUL character or a blank prompt passed, then every board run of the case failed
        (
            '{"prompt": "a\\u0000b", "scorer": "contains", "expected": {"answer": "b"}}',
            '"prompt" holds a NUL',
        ),
        (
            '{"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "\\u0000"}], '
            '"scorer": "contains", "expected": {"answer": "b"}}',
            "message 2 (user) holds a NUL",
        ),
        ('{"prompt": "  ", "scorer": "contains", "expected": {"answer": "b"}}', '"prompt" is blank'),
        # "name" read as the keys n, a, m, e; 5 made every case "could not be scored"; "?" matched every reply
        (
            '{"prompt": "x", "scorer": "instruction", "checks": [{"type": "json", "keys": "name"}]}',
            "list of names",
        ),
        (
            '{"prompt": "x", "scorer": "instruction", "checks": [{"type": "json", "keys": 5}]}',
            "list of names",
        ),
        (
            '{"prompt": "x", "scorer": "instruction", "checks": [{"type": "ends_with", "text": "?"}]}',
            "punctuation",
        ),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, line: str, what: str) -> None:
    p = tmp_path / "mine.jsonl"
    p.write_text(
        '{"id": "ok", "prompt": "hi", "scorer": "contains", "expected": {"answer": "hi"}}\n' + line + "\n"
    )
    with pytest.raises(SuiteError) as e:
        load_suite(p)
    assert "line 2" in e.value.message and what in e.value.message


def test_a_suites_max_tokens_is_checked_as_a_cases_is(tmp_path: Path) -> None:
    for bad in ('"lots"', "null", "100.7", "0"):
        p = tmp_path / "mine.jsonl"
        p.write_text(
            f'{{"suite": {{"name": "mine", "max_tokens": {bad}}}}}\n'
            '{"id": "ok", "prompt": "hi", "scorer": "contains", "expected": {"answer": "hi"}}\n'
        )
        with pytest.raises(SuiteError, match="max_tokens"):
            load_suite(p)


def test_eval_add_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "capitals.jsonl"
    p.write_text(
        '{"suite": {"name": "capitals", "scorer": "contains"}}\n'
        '{"id": "fr", "prompt": "Capital of France?", "expected": {"answer": "Paris"}}\n'
    )
    ws = tmp_path / "ws"
    assert main(["eval", "add", str(p), "--workspace", str(ws), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "capitals"
    assert (ws / "suites" / "capitals.jsonl").is_file()
    assert main(["eval", "list", "--workspace", str(ws), "--json"]) == 0
    names = {s["name"] for s in json.loads(capsys.readouterr().out)["suites"]}
    assert {"capitals", *DEFAULT_SUITES} <= names
    p.write_text(
        p.read_text() + '{"id": "de", "prompt": "Capital of Germany?", "expected": {"answer": "Berlin"}}\n'
    )
    with pytest.raises(SuiteError):
        add_suite(p, ws)
    assert len(add_suite(p, ws, replace=True).cases) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    assert main(["eval", "add", str(bad), "--workspace", str(ws)]) == 1


def test_a_suite_of_a_shipped_suites_name_is_added_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`eval add` of a suite named "perplexity" replaced the shipped one, without --replace and without a word:
    every run's default Evaluate then scored the user's cases."""
    from hexstudio.cli.main import main

    p = tmp_path / "mine.jsonl"
    p.write_text(
        '{"suite": {"name": "perplexity", "scorer": "exact"}}\n'
        '{"id": "a", "prompt": "Capital of France?", "expected": {"answer": "Paris"}}\n'
    )
    ws = tmp_path / "ws"
    assert main(["eval", "add", str(p), "--workspace", str(ws)]) == 1
    err = capsys.readouterr().err
    assert "ships a suite named 'perplexity'" in err and "default Evaluate" in err and "--replace" in err, err
    assert not (ws / "suites" / "perplexity.jsonl").exists()
    assert main(["eval", "add", str(p), "--workspace", str(ws), "--replace"]) == 0
    capsys.readouterr()
    assert main(["eval", "list", "--workspace", str(ws)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("perplexity"))
    assert "replaces shipped" in line, line


def test_a_suite_without_a_scorer_says_where_to_set_one(tmp_path: Path) -> None:
    """It said "unknown scorer None."."""
    p = tmp_path / "noscorer.jsonl"
    p.write_text('{"suite": {"name": "noscorer"}}\n{"id": "a", "prompt": "p", "expected": {"answer": "x"}}\n')
    with pytest.raises(SuiteError) as err:
        load_suite(p)
    assert "no scorer" in err.value.message and "None" not in err.value.message, err.value.message
    assert '"scorer"' in (err.value.hint or ""), err.value.hint


def test_no_answer_is_wrong_for_every_scorer() -> None:
    """An empty reply (a prompt that filled the context, reasoning cut at the token limit) scored correct for every
    shipped abstain case, and for a case whose checks were only no_comma or not_contains."""
    from hexstudio.core.eval.scoring import score_case
    from hexstudio.core.eval.suites import Case

    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    abstain = Case(id="a", scorer="tool_call", prompt="Hi", tools=tools, expected={"abstain": True})
    plain = Case(
        id="b",
        scorer="instruction",
        prompt="x",
        checks=[{"type": "no_comma"}, {"type": "not_contains", "text": "sorry"}],
    )
    for case in (abstain, plain):
        for reply in ("", "  \n", "<think>the budget ran out before an answer"):
            got = score_case(case, reply, "hermes")
            assert got["correct"] is False and "no answer" in got["why"], (case.id, reply, got)
    assert score_case(plain, "Fine thanks.", "hermes")["correct"] is True


def test_instruction_checks() -> None:
    assert check({"type": "lowercase"}, "all small here.")[0]
    assert not check({"type": "lowercase"}, "Not small.")[0]
    assert check({"type": "max_words", "n": 3}, "one two three")[0]
    assert check({"type": "bullets", "n": 2}, "- a\n- b")[0]
    sentences = {
        'He said "hi." Then he left.': 2,  # counted 1: the quote after the full stop hid the sentence end
        "Dr. Smith lives by the river.": 1,  # counted 2, as did the next: an abbreviation's full stop
        "The river, e.g. the Rhone, flows (slowly). It is wide!": 2,
        "One? Two. Three and 3.5 more...": 3,
    }
    for text, n in sentences.items():
        assert check({"type": "max_sentences", "n": 9}, text)[1] == f"{n} sentences (at most 9)", text
    assert check({"type": "json", "keys": ["a"]}, '```json\n{"a": 1}\n```')[0]
    assert not check({"type": "json", "keys": ["a"]}, "{a: 1}")[0]


def test_parity_and_three_way_drops() -> None:
    assert parity([1, 2, 3], [1, 2, 3]) == {"matched": 3, "total": 3, "exact": True, "first_diff": None}
    assert parity([1, 9, 3], [1, 2, 3])["matched"] == 1
    from hexstudio.core.eval.suites import Case

    cases = [Case(id=str(i), scorer="exact") for i in range(4)]
    res = {
        "float": {str(i): {"score": {"correct": True}} for i in range(4)},
        "sim": {str(i): {"score": {"correct": i < 3}} for i in range(4)},
        "board": {str(i): {"score": {"correct": i < 2}} for i in range(4)},
    }
    s = suite_scores(cases, res, "exact")
    assert [s["legs"][x]["value"] for x in ("float", "sim", "board")] == [1.0, 0.75, 0.5]
    assert s["drops"] == {"float->sim": 0.25, "sim->board": 0.25}


def test_a_large_drop_is_points_of_accuracy_or_a_share_of_perplexity() -> None:
    """Accuracy drops are in points (0..1), perplexity drops in the suite's own units: 12.00 -> 12.06 is only
    0.5 % worse, 3 -> 4 is 33 % worse; the page used to colour both by 0.05 absolute."""
    assert large_drop("exact", 0.06, 0.9) and not large_drop("exact", 0.05, 0.9)
    assert not large_drop("tool_call", -0.2, 0.5)  # a gain
    assert not large_drop("perplexity", 0.06, 12.0)
    assert large_drop("perplexity", 1.0, 3.0) and large_drop("perplexity", 0.61, 12.0)
    assert not large_drop("perplexity", 0.5, None) and not large_drop("exact", None, 0.9)


def test_a_suite_adds_up_one_kind_of_score(tmp_path: Path) -> None:
    """Right-or-wrong cases of any scorers make one accuracy; a perplexity or a parity case among them cannot
    (it has no right answer, and would count as a wrong one): such a suite is refused, saying how to split it.
    The suite's scorer comes from its cases, not from a header default they all override."""
    text = "The harbour lay quiet under a grey sky while the boats came in."
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        '{"id": "a", "prompt": "hi", "scorer": "exact", "expected": {"answer": "hi"}}\n'
        + json.dumps({"id": "b", "scorer": "perplexity", "text": text})
        + "\n"
    )
    with pytest.raises(SuiteError) as e:
        load_suite(mixed)
    assert "accuracy and perplexity" in e.value.message and "suite of their own" in (e.value.hint or "")
    accuracy = tmp_path / "accuracy.jsonl"
    accuracy.write_text(
        '{"suite": {"name": "acc", "scorer": "parity"}}\n'
        '{"id": "a", "prompt": "hi", "scorer": "exact", "expected": {"answer": "hi"}}\n'
        '{"id": "b", "prompt": "yo", "scorer": "contains", "expected": {"answer": "yo"}}\n'
    )
    s = load_suite(accuracy)
    assert s.scorer == "mixed"
    legs = {"board": {"a": {"score": {"correct": True}}, "b": {"score": {"correct": False}}}}
    assert suite_scores(s.cases, legs, s.scorer)["legs"]["board"]["text"] == "1/2 (50.0%)"
