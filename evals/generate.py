#!/usr/bin/env python3
"""Writes Switchyard's evaluation suites (JSONL) into this folder.

Every item is generated here from a fixed seed: nothing is downloaded or
copied from another data set. `geo` reads facts from two Debian data
packages (tzdata's zone.tab: which countries and cities lie on which
continent; iso-codes' ISO 3166-1 country names); the others need nothing.

    python3 evals/generate.py            # rewrite every suite
    python3 evals/generate.py --check    # fail if a committed suite differs

Multiple choice: {"context", "choices", "answer"}; each choice carries its
leading space, as lm-evaluation-harness's data does. Generation: {"prompt",
"answer"}, scored by exact match (see docs/EVALS.md).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ZONE_TAB = Path("/usr/share/zoneinfo/zone.tab")
ISO_3166 = Path("/usr/share/iso-codes/json/iso_3166-1.json")

# Common English words (written for this file), for the string tasks.
WORDS = """apple house river green table music water light stone bread chair
cloud dream earth field glass horse juice knife lemon money night ocean paper
queen radio sugar tiger uncle voice whale yacht zebra angel beach candle dance
eagle flame grape heart island jelly kitten ladder mango needle orange pencil
rabbit salad tomato umbrella violin window yellow garden forest planet rocket
silver winter summer spring autumn bottle button camera dragon engine finger
guitar hammer insect jacket kettle lizard magnet napkin parrot pepper puzzle
ribbon saddle ticket turtle valley wallet basket butter carpet cookie desert
doctor farmer flower friend helmet jungle letter mirror monkey number pillow
pocket potato school shadow singer spider sponge square street tunnel wizard""".split()

CONTINENTS = ["Africa", "America", "Asia", "Europe", "Australia"]
ISO_CODES = Path("/usr/share/iso-codes/json")


def iso_words() -> list[str]:
    """More words for the letter suites, beyond `WORDS`: every single word of 4-10 ASCII
    letters in iso-codes' names of languages (ISO 639-2), countries (3166-1), currencies
    (4217) and scripts (15924), lowercased (`wolof`, `tobago`, `dirham`), less `WORDS`;
    sorted, then shuffled from a fixed seed."""
    found = set()
    for name, key in (("iso_639-2", "639-2"), ("iso_3166-1", "3166-1"), ("iso_4217", "4217"), ("iso_15924", "15924")):
        for entry in json.loads((ISO_CODES / f"{name}.json").read_text())[key]:
            for word in re.split(r"[^A-Za-z]+", entry["name"]):
                if 4 <= len(word) <= 10 and word.isascii():
                    found.add(word.lower())
    words = sorted(found - set(WORDS))
    random.Random("switchyard-iso-words").shuffle(words)
    return words


def letter_words() -> list[str]:
    """The words `letter-gen` and its sentence twin ask about, in order: `WORDS` (less the
    two shots) shuffled from the suite's seed, then `iso_words()`, so a larger count keeps
    the first items as they were."""
    words = [w for w in WORDS if w not in ("table", "music")]
    random.Random("switchyard-letter-gen").shuffle(words)
    return words + iso_words()


def choice_item(rng: random.Random, context: str, right: str, wrong: list[str]) -> dict:
    """A multiple-choice item with `right` at a random place among `wrong`."""
    choices = list(dict.fromkeys(wrong))[:3]
    answer = rng.randrange(len(choices) + 1)
    choices.insert(answer, right)
    return {"context": context, "choices": [" " + c for c in choices], "answer": answer}


def numeric_distractors(rng: random.Random, right: int) -> list[str]:
    """Three wrong numbers a careless reader might pick: off by one or ten, digits swapped."""
    options = {right + 1, right - 1, right + 10, right - 10, int(str(abs(right))[::-1]) if right > 9 else right + 2}
    options.discard(right)
    picks = sorted(options)
    rng.shuffle(picks)
    return [str(p) for p in picks[:3]]


def arith(rng: random.Random, count: int) -> list[dict]:
    items = []
    for _ in range(count):
        op = rng.choice("+-x")
        if op == "+":
            a, b = rng.randint(1, 50), rng.randint(1, 50)
            right = a + b
        elif op == "-":
            a = rng.randint(10, 99)
            b = rng.randint(1, a)
            right = a - b
        else:
            a, b = rng.randint(2, 12), rng.randint(2, 12)
            right = a * b
        word = {"+": "plus", "-": "minus", "x": "times"}[op]
        context = f"Question: What is {a} {word} {b}?\nAnswer:"
        items.append(choice_item(rng, context, str(right), numeric_distractors(rng, right)))
    return items


# Worked examples before each generation question show the answer's form.
ARITH_SHOTS = "Question: What is 2 plus 3?\nAnswer: 5\n\nQuestion: What is 7 plus 6?\nAnswer: 13\n\n"


def arith_gen(rng: random.Random, count: int) -> list[dict]:
    items = []
    for _ in range(count):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        prompt = f"{ARITH_SHOTS}Question: What is {a} plus {b}?\nAnswer:"
        items.append({"prompt": prompt, "answer": str(a + b)})
    return items


UNITS = [
    ("metres", "kilometre", "kilometres", 1000),
    ("centimetres", "metre", "metres", 100),
    ("millimetres", "centimetre", "centimetres", 10),
    ("grams", "kilogram", "kilograms", 1000),
    ("minutes", "hour", "hours", 60),
    ("seconds", "minute", "minutes", 60),
    ("hours", "day", "days", 24),
    ("days", "week", "weeks", 7),
    ("months", "year", "years", 12),
    ("eggs", "dozen", "dozen", 12),
]


def units(rng: random.Random, count: int) -> list[dict]:
    items = []
    for _ in range(count):
        small, one, many, factor = rng.choice(UNITS)
        n = rng.randint(1, 9)
        unit = one if n == 1 else many
        context = f"Question: How many {small} are in {n} {unit}?\nAnswer:"
        right = n * factor
        others = [f for (_, _, _, f) in UNITS if f != factor]
        wrong = [str(n * rng.choice(others)) for _ in range(6)] + [str(right * 10), str(max(1, right // 10))]
        wrong = [w for w in dict.fromkeys(wrong) if w != str(right)]
        rng.shuffle(wrong)
        items.append(choice_item(rng, context, str(right), wrong))
    return items


def strings(rng: random.Random, count: int) -> list[dict]:
    items = []
    letters = "abcdefghijklmnopqrstuvwxyz"
    for _ in range(count):
        kind = rng.randrange(3)
        word = rng.choice(WORDS)
        if kind == 0:
            context = f'Question: What is the first letter of the word "{word}"?\nAnswer:'
            right = word[0]
            wrong = [c for c in rng.sample(letters, 6) if c != right]
        elif kind == 1:
            context = f'Question: What is the last letter of the word "{word}"?\nAnswer:'
            right = word[-1]
            wrong = [c for c in rng.sample(letters, 6) if c != right]
        else:
            a, b = rng.sample(WORDS, 2)
            while a[0] == b[0]:
                a, b = rng.sample(WORDS, 2)
            context = f'Question: Which word comes first in alphabetical order, "{a}" or "{b}"?\nAnswer:'
            right = min(a, b)
            wrong = [max(a, b)]
        items.append(choice_item(rng, context, right, wrong))
    return items


def geo_facts() -> tuple[dict[str, str], dict[str, str]]:
    """Countries and cities by continent, from tzdata and iso-codes."""
    names = {c["alpha_2"]: c.get("common_name", c["name"]) for c in json.loads(ISO_3166.read_text())["3166-1"]}
    countries: dict[str, set[str]] = {}
    cities: dict[str, str] = {}
    for line in ZONE_TAB.read_text().splitlines():
        if line.startswith("#"):
            continue
        code, _, zone = line.split("\t")[:3]
        parts = zone.split("/")
        continent = parts[0]
        if continent not in CONTINENTS:
            continue
        countries.setdefault(code, set()).add(continent)
        if len(parts) == 2:
            cities[parts[1].replace("_", " ")] = continent
    # Countries wholly in one continent (Russia, spanning two, is left out).
    by_country = {names[c]: next(iter(s)) for c, s in countries.items() if len(s) == 1 and c in names}
    return by_country, cities


def geo(rng: random.Random, count: int) -> list[dict]:
    by_country, cities = geo_facts()
    facts = [(f"{name} is a country in", cont) for name, cont in sorted(by_country.items())]
    facts += [(f"{city} is a city in", cont) for city, cont in sorted(cities.items())]
    rng.shuffle(facts)
    items = []
    for context, continent in facts[:count]:
        wrong = [c for c in CONTINENTS if c != continent]
        rng.shuffle(wrong)
        items.append(choice_item(rng, context, continent, wrong))
    return items


def geo_gen(rng: random.Random, count: int) -> list[dict]:
    """The geo facts as generation: three answered questions as shots, then one."""
    by_country, cities = geo_facts()
    facts = [(f"the country {name}", cont) for name, cont in sorted(by_country.items())]
    facts += [(f"the city {city}", cont) for city, cont in sorted(cities.items())]
    rng.shuffle(facts)
    question = "Question: On which continent is {}?\nAnswer:"
    shots = "".join(question.format(place) + f" {continent}\n\n" for place, continent in facts[:3])
    return [{"prompt": shots + question.format(place), "answer": continent} for place, continent in facts[3:3 + count]]


def city_countries() -> dict[str, str]:
    """Cities and the country each is in, from tzdata's zone.tab and iso-codes. Left out:
    country names that are lists or carry parentheses ("Korea, Republic of"), and cities
    whose name is part of their country's or the reverse (Kuwait, Singapore)."""
    names = {c["alpha_2"]: c.get("common_name", c["name"]) for c in json.loads(ISO_3166.read_text())["3166-1"]}
    cities = {}
    for line in ZONE_TAB.read_text().splitlines():
        if line.startswith("#"):
            continue
        code, _, zone = line.split("\t")[:3]
        parts = zone.split("/")
        country = names.get(code)
        if parts[0] not in CONTINENTS or len(parts) != 2 or not country:
            continue
        city = parts[1].replace("_", " ")
        if any(c in country for c in ",()") or city.lower() in country.lower() or country.lower() in city.lower():
            continue
        cities[city] = country
    return cities


def country_gen(rng: random.Random, count: int) -> list[dict]:
    """Which country a city is in, as generation: three answered questions, then one."""
    facts = sorted(city_countries().items())
    rng.shuffle(facts)
    question = "Question: In which country is the city {}?\nAnswer:"
    shots = "".join(question.format(city) + f" {country}\n\n" for city, country in facts[:3])
    return [{"prompt": shots + question.format(city), "answer": country} for city, country in facts[3:3 + count]]


def letter_gen(rng: random.Random, count: int) -> list[dict]:
    """The first letter of a word, as generation: two answered questions, then one."""
    question = 'Question: What is the first letter of the word "{}"?\nAnswer:'
    shots = question.format("table") + " t\n\n" + question.format("music") + " m\n\n"
    return [{"prompt": shots + question.format(w), "answer": w[0]} for w in letter_words()[:count]]


def country_sentence_gen(rng: random.Random, count: int) -> list[dict]:
    """`country-gen`'s questions (the same cities, shots and order), answered in a
    sentence: `Lusaka is a city in Zambia.`, about ten tokens where `country-gen`'s
    answers are one to three, the country near the end."""
    facts = sorted(city_countries().items())
    random.Random("switchyard-country-gen").shuffle(facts)
    question = "Question: In which country is the city {}?\nAnswer:"
    answer = "{} is a city in {}."
    shots = "".join(question.format(city) + " " + answer.format(city, country) + "\n\n"
                    for city, country in facts[:3])
    return [{"prompt": shots + question.format(city), "answer": answer.format(city, country)}
            for city, country in facts[3:3 + count]]


def letter_sentence_gen(rng: random.Random, count: int) -> list[dict]:
    """`letter-gen`'s questions (the same words and order), answered in a sentence:
    `The word "garden" starts with the letter g.`, about ten tokens, the letter last."""
    question = 'Question: What is the first letter of the word "{}"?\nAnswer:'
    answer = 'The word "{}" starts with the letter {}.'
    shots = "".join(question.format(w) + " " + answer.format(w, w[0]) + "\n\n" for w in ("table", "music"))
    return [{"prompt": shots + question.format(w), "answer": answer.format(w, w[0])}
            for w in letter_words()[:count]]


SUITES = {
    "arith": (arith, 300),
    "units": (units, 200),
    "strings": (strings, 200),
    "geo": (geo, 200),
    "arith-gen": (arith_gen, 100),
    "geo-gen": (geo_gen, 200),
    # Every city tzdata has (270 after the three shots); 118 common words, then iso-codes' words.
    "country-gen": (country_gen, 270),
    "letter-gen": (letter_gen, 600),
    "country-sentence-gen": (country_sentence_gen, 270),
    "letter-sentence-gen": (letter_sentence_gen, 600),
}


def render(name: str, count: int | None = None) -> str:
    make, default = SUITES[name]
    rng = random.Random(f"switchyard-{name}")
    items = make(rng, count or default)
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    parser.add_argument("--suite", choices=sorted(SUITES), help="only this suite")
    parser.add_argument("--count", type=int, help="items (default: the suite's own count)")
    parser.add_argument("--out", type=Path, help="write here instead of evals/<suite>.jsonl")
    args = parser.parse_args()
    names = [args.suite] if args.suite else sorted(SUITES)
    stale = []
    for name in names:
        text = render(name, args.count)
        path = args.out or HERE / f"{name}.jsonl"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path} ({text.count(chr(10))} items)", file=sys.stderr)
    if stale:
        print("stale suites (run python3 evals/generate.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
