"""Writes the built-in model's training, calibration and validation texts.

The text is project-written: short English prose generated from a small grammar of
sentences about a workshop, boards, weather, travel and everyday life, with a seeded RNG.
No third-party text is used, so the corpus and the model trained on it are covered by
the project's own licence (Apache-2.0). Deterministic: the same seed gives the same text.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

NAMES = ["Anna", "Ben", "Clara", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Leo",
         "Maya", "Noah", "Olga", "Paul", "Rosa", "Sam", "Tara", "Victor"]
PLACES = ["the workshop", "the garden", "the station", "the library", "the harbour", "the market", "the lab",
          "the old bridge", "the kitchen", "the school", "the river", "the hill", "the office", "the village"]
TIMES = ["in the morning", "at noon", "in the evening", "at night", "on Monday", "after lunch", "before dawn",
         "in the spring", "last winter", "every day", "on a rainy day", "at the weekend"]
THINGS = ["a small board", "a red book", "a cup of tea", "the new chip", "a long letter", "a map", "the radio",
          "a basket of apples", "the lamp", "a wooden box", "a bicycle", "the kettle", "a warm coat", "the camera",
          "a loaf of bread", "the old clock", "a green notebook", "the laptop"]
ADJ = ["quiet", "bright", "cold", "warm", "busy", "small", "large", "old", "new", "happy", "tired", "careful",
       "clever", "slow", "fast", "kind", "patient", "curious"]
VERBS_T = ["found", "carried", "opened", "fixed", "painted", "bought", "sold", "read", "built", "cleaned",
           "measured", "tested", "watched", "wrote", "moved", "checked"]
VERBS_I = ["walked", "waited", "worked", "laughed", "slept", "sang", "listened", "smiled", "rested", "travelled"]
WEATHER = ["The sky was grey and the wind was strong.", "The sun was warm on the stones.",
           "Rain fell softly on the roof.", "Snow covered the fields and the roads.",
           "The air was clear and the river was calm.", "Clouds moved slowly over the hills."]
CONNECT = ["Then", "Later", "After that", "Soon", "At last", "Meanwhile", "Still", "So"]
QUESTIONS = [("What is the capital of France?", "The capital of France is Paris."),
             ("What colour is the sky?", "The sky is blue on a clear day."),
             ("How many days are in a week?", "A week has seven days."),
             ("What do bees make?", "Bees make honey."),
             ("Where does the sun rise?", "The sun rises in the east."),
             ("What is water made of?", "Water is made of hydrogen and oxygen."),
             ("How many legs does a spider have?", "A spider has eight legs."),
             ("What is the largest ocean?", "The largest ocean is the Pacific Ocean.")]


def sentence(r: random.Random) -> str:
    n, p, t, th, a = r.choice(NAMES), r.choice(PLACES), r.choice(TIMES), r.choice(THINGS), r.choice(ADJ)
    forms = [
        f"{n} {r.choice(VERBS_T)} {th} in {p} {t}.",
        f"{t.capitalize()}, {n} {r.choice(VERBS_I)} near {p}.",
        f"The {a} {th.split(' ', 1)[-1]} was in {p}.",
        f"{n} was {a} because {r.choice(NAMES)} {r.choice(VERBS_T)} {th}.",
        f"{r.choice(CONNECT)} {n} {r.choice(VERBS_I)} and {r.choice(VERBS_T)} {th}.",
        r.choice(WEATHER),
        f"{n} said that {p} was {a} {t}.",
        f"In {p}, {n} and {r.choice(NAMES)} {r.choice(VERBS_T)} {th} together.",
    ]
    return r.choice(forms)


def paragraph(r: random.Random) -> str:
    if r.random() < 0.15:
        q, a = r.choice(QUESTIONS)
        return f"Question: {q} Answer: {a}"
    return " ".join(sentence(r) for _ in range(r.randint(3, 7)))


def write(path: Path, seed: int, paragraphs: int) -> None:
    r = random.Random(seed)
    path.write_text("\n\n".join(paragraph(r) for _ in range(paragraphs)) + "\n", encoding="utf-8")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write(out / "train.txt", 1, 6000)
    write(out / "calibration.txt", 2, 200)
    write(out / "validation.txt", 3, 200)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "hexstudio" / "shared" / "data" / "builtin_model" / "text")
