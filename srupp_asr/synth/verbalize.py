"""Written English to the words a TTS voice should say: numbers, symbols and a few abbreviations spelled out.

:func:`verbalize` returns the spoken form of one sentence, or None when the sentence holds something this module
cannot say unambiguously (a URL or e-mail address, a time, a fraction, a range, a token mixing letters and
digits, an acronym, a Roman numeral, an abbreviation such as "St." or "No.", any character outside plain
ASCII letters and punctuation). Dropping such sentences keeps every transcript equal to what the voice said.

Numbers are read the American way, without "and" ("one hundred five"); a four-digit number from 1100 to 2099
without a thousands comma is read as a year ("nineteen eighty-four", "two thousand five", "twenty twelve"),
as people also read counts like "1500 men" ("fifteen hundred").
"""

from __future__ import annotations

import re

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (10**3, "thousand"))
_ORDINAL_IRREGULAR = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
MAX_NUMBER = 10**15 - 1  # the largest integer read ("nine hundred ninety-nine trillion ...")


def number_words(n: int) -> str:
    """Cardinal words of an integer: 105 -> "one hundred five", -3 -> "minus three", 21 -> "twenty-one"."""
    if n < 0:
        return "minus " + number_words(-n)
    if n > MAX_NUMBER:
        raise ValueError(f"{n} is larger than {MAX_NUMBER}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {number_words(rest)}" if rest else "")
    for scale, name in _SCALES:
        if n >= scale:
            high, rest = divmod(n, scale)
            return f"{number_words(high)} {name}" + (f" {number_words(rest)}" if rest else "")
    raise AssertionError("unreachable")


def ordinal_words(n: int) -> str:
    """Ordinal words of a non-negative integer: 1 -> "first", 22 -> "twenty-second", 100 -> "one hundredth"."""
    if n < 0:
        raise ValueError(f"ordinals of negative numbers are not read: {n}")
    words = number_words(n)
    head, sep, last = words.rpartition("-") if "-" in words.split()[-1] else words.rpartition(" ")
    if last in _ORDINAL_IRREGULAR:
        last = _ORDINAL_IRREGULAR[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + sep + last


def year_words(n: int) -> str:
    """A year as people say it: 1984 -> "nineteen eighty-four", 1905 -> "nineteen oh five", 2007 ->
    "two thousand seven", 2012 -> "twenty twelve", 1900 -> "nineteen hundred"; other numbers as cardinals."""
    if not 1000 <= n <= 9999 or n % 1000 == 0 or 2000 < n < 2010:
        return number_words(n)
    high, low = divmod(n, 100)
    if low == 0:
        return f"{number_words(high)} hundred"
    if low < 10:
        return f"{number_words(high)} oh {number_words(low)}"
    return f"{number_words(high)} {number_words(low)}"


def decimal_words(text: str) -> str:
    """Words of a decimal numeral (digits, optional thousands commas, optional point): "3.14" -> "three point
    one four", "1,000" -> "one thousand", ".5" -> "point five"."""
    whole, _, frac = text.replace(",", "").partition(".")
    words = number_words(int(whole)) if whole else ""
    if frac:
        words = (words + " point " if words else "point ") + " ".join(_ONES[int(d)] for d in frac)
    return words


def _plural(words: str) -> str:
    """ "nineteen sixty" -> "nineteen sixties", "two thousand" -> "two thousands"."""
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


# A numeral: thousands-grouped ("1,234,567") or plain digits, with an optional decimal part; never glued to a
# letter, digit or another decimal point (so "A4", "mp3" and "1.2.3" stay unread and the sentence is dropped).
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_EDGE_L = r"(?<![\w.,$£])"
_EDGE_R = r"(?![\w%]|[.,]\d)"

_CURRENCY = re.compile(rf"([$£])\s?({_NUM})(?:\s+(thousand|million|billion|trillion)\b)?{_EDGE_R}")
_PERCENT = re.compile(rf"{_EDGE_L}({_NUM})\s?%")
_ORDINAL = re.compile(r"(?<![\w.,])(\d+)(st|nd|rd|th)\b")
_DECADE = re.compile(r"(?<![\w.,])(\d{3}0)'?s\b")
_NEGATIVE = re.compile(rf"(?<![\w.,-])-({_NUM}){_EDGE_R}")
_NUMBER = re.compile(rf"{_EDGE_L}({_NUM}){_EDGE_R}")

# What cannot be read without guessing: the whole sentence is dropped.
_UNSAYABLE = re.compile(
    r"https?:|www\.|\w@\w|\.(?:com|org|net|edu|gov)\b"  # URLs and e-mail addresses
    r"|\d\s*[-–/:]\s*\d"  # ranges, fractions, times, dates
    r"|\d,\d{1,2}\b|\d,\d{4}"  # commas that are not thousands separators ("1,5")
)
_ROMAN = re.compile(r"^(?=[MDCLXVI]{2,}$)M{0,3}(?:C[MD]|D?C{0,3})(?:X[CL]|L?X{0,3})(?:I[XV]|V?I{0,3})$")

# Abbreviations a voice reads one way and a transcript could hold another: the unambiguous ones are spelled out,
# a sentence with any other is dropped. Keys are lower case; the period is part of the match.
_EXPAND = {
    "mr.": "Mister",
    "mrs.": "Missus",
    "dr.": "Doctor",
    "etc.": "et cetera",
    "e.g.": "for example",
    "i.e.": "that is",
    "vs.": "versus",
}
# Read differently by different voices (or by a voice and a transcriber) when followed by more of the sentence.
ABBREVIATIONS = frozenset(
    """
    mr mrs ms dr st jr sr prof gen col capt lt sgt gov rev hon inc ltd co corp no nos vol vols fig figs
    pp p ch chap cf viz ibid approx mt ave blvd rd jan feb mar apr jun jul aug sep sept oct nov dec mon
    tue wed thu fri sat sun esq messrs mme mlle ft lb lbs oz yd yds sq ed eds dept univ est op cit al
    a.m p.m
    """.split()  # noqa: SIM905 (a word list reads better as text)
)
# The ones that also end a sentence as a plain word ("I said no.") are only abbreviations before more text;
# these never are words.
_FINAL_ABBREVIATIONS = frozenset(
    """
    jr sr inc ltd corp esq messrs ibid approx viz cf ave blvd dept univ mme mlle lbs yds vols figs a.m
    p.m
    """.split()  # noqa: SIM905 (a word list reads better as text)
)
_ABBREV_TOKEN = re.compile(r"(?<![\w.])((?:[A-Za-z]\.){2,}|[A-Za-z]+\.)")

_TRANSLATE = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2013": "-",
        "\u2014": " - ",
        "\u2026": "...",
        "\u00a0": " ",
        "\t": " ",
    }
)
_ALLOWED = re.compile(r"[A-Za-z' ,.;:!?\"()-]*")
_SYMBOLS = {"&": " and ", "+": " plus ", "=": " equals "}
_NEEDS_WORDS = re.compile(r"[\d$£%&+=]")
_CAPITALS = re.compile(r"(?<![A-Za-z'])[A-Z][A-Z']*[A-Z](?![A-Za-z'])")  # two or more capitals


def _currency(match: re.Match) -> str:
    symbol, amount, scale = match.groups()
    unit, subunit = ("dollar", "cent") if symbol == "$" else ("pound", "penny")
    if scale:
        return f"{decimal_words(amount)} {scale} {unit}s"
    whole, _, frac = amount.replace(",", "").partition(".")
    if frac and len(frac) != 2:
        return f"{decimal_words(amount)} {unit}s"
    units, cents = int(whole or 0), int(frac or 0)
    parts = []
    if units or not cents:
        parts.append(f"{number_words(units)} {unit}" + ("" if units == 1 else "s"))
    if cents:
        sub = subunit if cents == 1 else ("pence" if subunit == "penny" else "cents")
        parts.append(f"{number_words(cents)} {sub}")
    return " and ".join(parts)


def _ordinal(match: re.Match) -> str:
    digits, suffix = match.groups()
    n = int(digits)
    expected = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return ordinal_words(n) if suffix.lower() == expected else match.group(0)  # "1th" stays and is dropped


def _integer_or_decimal(text: str) -> str:
    if re.fullmatch(r"\d{4}", text) and 1100 <= int(text) <= 2099:
        return year_words(int(text))
    if len(text.replace(",", "").partition(".")[0]) > 15:
        return text  # too long to read: left as digits, so the sentence is dropped
    return decimal_words(text)


def _abbreviations(text: str) -> str | None:
    """Spell out the unambiguous abbreviations; None when another one is present."""
    out = []
    last = 0
    for match in _ABBREV_TOKEN.finditer(text):
        key = match.group(1).lower()
        at_end = not text[match.end(1) :].strip(" \"')")
        if key in _EXPAND:
            # The abbreviation's period also ended the sentence: keep a full stop after the words.
            out.append(text[last : match.start(1)] + _EXPAND[key] + ("." if at_end else ""))
            last = match.end(1)
            continue
        bare = key.rstrip(".")
        if bare in (_FINAL_ABBREVIATIONS if at_end else ABBREVIATIONS):
            return None
    out.append(text[last:])
    return "".join(out)


def verbalize(sentence: str) -> str | None:
    """The spoken form of one written English sentence, or None when it cannot be said unambiguously."""
    text = re.sub(r".\x08", "", sentence).translate(_TRANSLATE)  # drop overstrike (fortune files)
    text = " ".join(text.replace("--", " - ").split())
    if not text or _UNSAYABLE.search(text):
        return None
    text = _abbreviations(text)
    if text is None:
        return None
    if _NEEDS_WORDS.search(text):
        text = _CURRENCY.sub(_currency, text)
        text = _PERCENT.sub(lambda m: f"{decimal_words(m.group(1))} percent", text)
        text = _ORDINAL.sub(_ordinal, text)
        text = _DECADE.sub(lambda m: _plural(year_words(int(m.group(1)))), text)
        text = _NEGATIVE.sub(lambda m: "minus " + _integer_or_decimal(m.group(1)), text)
        text = _NUMBER.sub(lambda m: _integer_or_decimal(m.group(1)), text)
        for symbol, words in _SYMBOLS.items():
            text = text.replace(symbol, words)
        text = " ".join(text.split())
    if not _ALLOWED.fullmatch(text):
        return None  # digits left over, other symbols, non-ASCII letters
    shouted = []
    for word in _CAPITALS.findall(text):
        core = word.strip("'")
        if _ROMAN.match(core) or len(core) <= 3:
            return None  # a Roman numeral, or an acronym a voice may spell or read as a word
        shouted.append(core)
    for word in shouted:  # shouted words ("DON'T PANIC") are said as words
        text = re.sub(rf"\b{re.escape(word)}\b", word.lower(), text)
    return text
