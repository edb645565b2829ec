"""Scoring one reply of one case, and a suite's score per leg (float / simulated / board).

Every scorer returns (correct: bool, why: str); none raises on what a model writes."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from hexstudio.core.eval.suites import Case
from hexstudio.core.eval.toolcall import parse_reply, score_tool_call

LEGS = ("float", "sim", "htp", "board")
LEG_TITLES = {
    "float": "host float",
    "sim": "host quantized (simulation)",
    "htp": "host HTP simulation (Qualcomm QNN, x86)",
    "board": "board",
}
DROP_STEPS = (("float", "sim"), ("sim", "board"))  # a suite's drops: quantization, then the board
LARGE_DROP = 0.05  # 5 points of accuracy, or perplexity 5 % higher


def large_drop(scorer: str, drop: float | None, before: float | None) -> bool:
    """Whether a step's drop is large enough to show in red: an accuracy (0..1) lower by more than 5 points, or a
    perplexity more than 5 % higher than `before` (a perplexity drop is in the suite's own units: 12.00 -> 12.06 is
    +0.06 and only 0.5 % worse, 3 -> 4 is +1.0 and 33 % worse)."""
    if drop is None:
        return False
    if scorer == "perplexity":
        return before is not None and before > 0 and drop / before > LARGE_DROP
    return drop > LARGE_DROP


def _words(text: str) -> list[str]:
    return re.findall(r"\b[\w'-]+\b", text)


# a sentence ends at . ! or ?, then any closing quotes or brackets, then a space or the end of the text; a match
# starts only where a word or a run of marks starts (from inside one, a long run would be read again and again)
_SENTENCE_END = re.compile(r"(?<![\w.!?])(?P<word>(?:\w+(?:\.\w+)*)?)(?P<end>[.!?]+)[\"'”’)\]]*(?=\s|$)")
# words whose full stop ends no sentence ("Dr. Smith", "a river, e.g. the Rhone")
_ABBREVIATIONS = ("mr", "mrs", "ms", "dr", "st", "e.g", "i.e", "etc", "vs")


def _sentences(text: str) -> int:
    """How many sentences the text has: the pieces with a word in them between sentence ends."""
    n, start = 0, 0
    for m in _SENTENCE_END.finditer(text):
        if m["end"] == "." and m["word"].lower() in _ABBREVIATIONS:
            continue
        n += bool(re.search(r"\w", text[start : m.end()]))
        start = m.end()
    return n + bool(re.search(r"\w", text[start:]))


def check(c: dict[str, Any], reply: str) -> tuple[bool, str]:
    t = c["type"]
    s = reply.strip()
    letters = [ch for ch in s if ch.isalpha()]
    if t == "lowercase":
        return bool(letters) and all(ch.islower() for ch in letters), "only lowercase letters"
    if t == "uppercase":
        return bool(letters) and all(ch.isupper() for ch in letters), "only capital letters"
    if t == "max_words":
        n = len(_words(s))
        return 0 < n <= int(c["n"]), f"{n} words (at most {c['n']})"
    if t == "min_words":
        n = len(_words(s))
        return n >= int(c["n"]), f"{n} words (at least {c['n']})"
    if t == "max_sentences":
        n = _sentences(s)
        return 0 < n <= int(c["n"]), f"{n} sentences (at most {c['n']})"
    if t == "bullets":
        n = len([ln for ln in s.splitlines() if re.match(r"^\s*[-*]\s+\S", ln)])
        return n == int(c["n"]), f"{n} bullets (exactly {c['n']})"
    if t == "no_comma":
        return "," not in s, "no comma"
    if t == "contains":
        return str(c["text"]).lower() in s.lower(), f"contains {c['text']!r}"
    if t == "not_contains":
        return str(c["text"]).lower() not in s.lower(), f"does not contain {c['text']!r}"
    if t == "starts_with":
        return s.lower().startswith(str(c["text"]).lower()), f"starts with {c['text']!r}"
    if t == "ends_with":
        return s.lower().rstrip(".!? ").endswith(
            str(c["text"]).lower().rstrip(".!? ")
        ), f"ends with {c['text']!r}"
    if t == "json":
        body = re.sub(r"^```[a-zA-Z]*\s*|\s*```$", "", s)
        try:
            doc = json.loads(body)
        except ValueError:
            return False, "valid JSON"
        keys = c.get("keys") or []
        return isinstance(doc, dict) and all(k in doc for k in keys), f"a JSON object with {', '.join(keys)}"
    return False, f"unknown check {t!r}"


# a reasoning block before the answer (DeepSeek-R1 distills, Nemotron with reasoning on, an empty one some
# templates force): the answer is what follows it; an unclosed one is reasoning cut at the token limit
_THINKING = re.compile(r"^\s*(?:<think>)?.*?</think>\s*", re.S)


def _reasoning_unfinished(reply: str, prompt: str = "") -> bool:
    """Whether the reply is a reasoning block never closed: one it opened, or one its prompt opened (DeepSeek-R1
    distills' templates end the prompt with <think>, so the reply starts inside the block)."""
    opened = reply.lstrip().startswith("<think>") or prompt.rstrip().endswith("<think>")
    return opened and "</think>" not in reply


def answer_of(reply: str, prompt: str = "") -> str:
    """The reply without a leading <think>...</think> block ("" for reasoning that never finished)."""
    if "</think>" in reply:
        return _THINKING.sub("", reply, count=1)
    return "" if _reasoning_unfinished(reply, prompt) else reply


def score_case(case: Case, reply: str, tool_format: str, prompt: str = "") -> dict[str, Any]:
    """{"correct": bool, "why": str, ...} for a generated reply to `prompt` (its answer: a reasoning block is not
    scored). No answer at all (an empty reply, a prompt that filled the context, reasoning cut at the token limit)
    is wrong for every scorer: it abstained from no tool and kept no instruction."""
    answer = answer_of(reply, prompt)
    if not answer.strip():
        cut = _reasoning_unfinished(reply, prompt)
        why = (
            f"the reasoning did not finish within max_tokens ({case.max_tokens})" if cut else "an empty reply"
        )
        return {"correct": False, "why": f"no answer: {why}"}
    reply = answer
    try:
        if case.scorer == "tool_call":
            parsed = parse_reply(reply, tool_format)
            ok, why = score_tool_call(parsed, case.expected, case.tools or [])
            return {"correct": ok, "why": why, "parsed": parsed.as_json()}
        if case.scorer == "instruction":
            results = [(c["type"], *check(c, reply)) for c in case.checks]
            failed = [f"{why}: no" for _t, ok, why in results if not ok]
            return {"correct": not failed, "why": "; ".join(failed) if failed else "every check holds"}
        answers = case.expected.get("answer")
        options = answers if isinstance(answers, list) else [answers]
        s = reply.strip()
        if case.scorer == "exact":
            ok = any(s.lower().rstrip(".") == str(a).strip().lower().rstrip(".") for a in options)
        elif case.scorer == "contains":
            ok = any(str(a).lower() in s.lower() for a in options)
        elif case.scorer == "regex":
            ok = any(re.search(str(a), s) is not None for a in options)
        else:
            return {"correct": False, "why": f"{case.scorer} is not scored on a reply"}
        return {"correct": ok, "why": "matches" if ok else f"expected {' or '.join(map(str, options))!r}"}
    except Exception as exc:  # a scorer bug must not end the suite: the case is counted wrong, with why
        return {"correct": False, "why": f"could not be scored: {type(exc).__name__}: {exc}"}


def parity(board_ids: list[int], host_ids: list[int]) -> dict[str, Any]:
    """Token-by-token agreement of two greedy continuations: matched = the common prefix, of N = the host's
    length (the board's, if longer); exact when both are identical."""
    n = max(len(host_ids), len(board_ids))
    same = 0
    for a, b in zip(board_ids, host_ids, strict=False):
        if a != b:
            break
        same += 1
    return {
        "matched": same,
        "total": n,
        "exact": board_ids == host_ids,
        "first_diff": None if board_ids == host_ids else same,
    }


def perplexity(nll_sum: float, tokens: int) -> float | None:
    return round(math.exp(nll_sum / tokens), 4) if tokens else None


def suite_scores(
    cases: list[Case], results: dict[str, dict[str, dict[str, Any]]], scorer: str
) -> dict[str, Any]:
    """A suite's score on each leg from per-case results ({leg: {case id: result}}), with the drop at each step
    (float -> sim -> board). Accuracy suites: correct / cases. Perplexity: exp(total NLL / tokens).
    Parity: matched / total tokens, board against the host simulation."""
    out: dict[str, Any] = {"scorer": scorer, "legs": {}, "drops": {}}
    for leg in LEGS:
        rs = results.get(leg) or {}
        done = [rs[c.id] for c in cases if c.id in rs]
        if scorer == "perplexity":
            nll = sum(float(r.get("nll_sum") or 0) for r in done)
            toks = sum(int(r.get("tokens") or 0) for r in done)
            out["legs"][leg] = (
                None
                if not done or not toks
                else {
                    "value": perplexity(nll, toks),
                    "tokens": toks,
                    "cases": len(done),
                    "of": len(cases),
                    "text": f"{perplexity(nll, toks):.3f}",
                }
            )
        elif scorer == "parity":
            if leg not in ("board", "htp") or not done:
                out["legs"][leg] = None
                continue
            m = sum(int(r["parity"]["matched"]) for r in done if r.get("parity"))
            n = sum(int(r["parity"]["total"]) for r in done if r.get("parity"))
            exact = sum(1 for r in done if (r.get("parity") or {}).get("exact"))
            compared = sum(1 for r in done if r.get("parity"))
            out["legs"][leg] = {
                "value": round(m / n, 4) if n else None,
                "matched": m,
                "total": n,
                "exact_cases": exact,
                "compared": compared,
                "cases": len(done),
                "of": len(cases),
                # no host reference to compare with (no sim leg, no tokenizer): not measured, never "0/0"; compared
                # but empty on both sides: said as such, not as a missing reference
                "text": f"{m}/{n}"
                if n
                else "no tokens to compare (every continuation empty on both sides)"
                if compared
                else "not measured (no host reference)",
            }
        else:
            correct = sum(1 for r in done if (r.get("score") or {}).get("correct"))
            malformed = sum(
                1 for r in done if ((r.get("score") or {}).get("parsed") or {}).get("kind") == "malformed"
            )
            out["legs"][leg] = (
                None
                if not done
                else {
                    "value": round(correct / len(done), 4),
                    "correct": correct,
                    "cases": len(done),
                    "of": len(cases),
                    "malformed": malformed,
                    "text": f"{correct}/{len(done)} ({100 * correct / len(done):.1f}%)",
                }
            )
    for a, b in DROP_STEPS:
        x, y = out["legs"].get(a), out["legs"].get(b)
        if x and y and x.get("value") is not None and y.get("value") is not None:
            d = y["value"] - x["value"]
            out["drops"][f"{a}->{b}"] = (round(d, 4) if scorer == "perplexity" else round(-d, 4)) or 0.0
    return out
