"""Written English to the words a TTS voice should say: numbers, symbols and a few abbreviations spelled out.

:func:`verbalize` returns the spoken form of one sentence, or None when the sentence holds something this module
cannot say unambiguously (a URL or e-mail address, a time, a fraction, a range, a token mixing letters and
digits, an acronym, a Roman numeral, an abbreviation such as "St." or "No.", any character outside plain
ASCII letters and punctuation). Dropping such sentences keeps every transcript equal to what the voice said.

The spoken form is what every engine is given, and its words are exactly the transcript's
(:func:`srupp_asr.text.normalize_text` of it): plain words (letters, with apostrophes and hyphens inside)
separated by spaces and the clause punctuation ``, ; : . ! ?`` that only sets pauses and intonation. Quotes go;
brackets, dashes and ellipses become commas; labels ("Q:", "A:", "a)", "qotd:") and emoticons are left out.
A sentence is dropped when an engine would say something other than its words (measured by comparing what
espeak-ng, flite and festival make of the spoken form and of the transcript; see
``tests/test_synth_text_audio.py``):

- punctuation glued inside a token ("comp.unix", "a:b", "U.S.", "yes,no"): read out as "dot", "colon", ...;
- a word part of two or more letters without a vowel ("Mr", "St", "hmm", "ftp", "'ll" alone): spelled
  letter by letter or expanded ("mister", "saint" / "street");
- capitals after a word's first letter ("CDs", "IBM's", "MacDonald", "TeX"): spelled, or split in two;
- a lone all-capital word of four letters or more ("UNIX", "QOTD"): an acronym, read as a word or spelled
  (two or more are shouting, "DON'T PANIC", and are said as lower-case words);
- a letter three times in a row ("Shhh", "awwwesome"): spelled or garbled;
- "V" or "X" alone, or "I" after a king's name or a word like "book", "part", "war": read as a number
  ("World War one", "Henry the fifth");
- a US state abbreviation that flite expands ("Ca", "Boston Mass"), abbreviations without their period that
  engines expand or spell ("dept", "adj", "est"); "etc" without a period is said "et cetera".

Numbers are read the American way, without "and" ("one hundred five"); a four-digit number from 1100 to 2099
without a thousands comma is read as a year ("nineteen eighty-four", "two thousand five", "twenty twelve"),
as people also read counts like "1500 men" ("fifteen hundred").
"""

from __future__ import annotations

import itertools
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
    adj adv prep conj pron interj
    a.m p.m
    """.split()  # noqa: SIM905 (a word list reads better as text)
)
# The ones that also end a sentence as a plain word ("I said no.") are only abbreviations before more text;
# these never are words.
_FINAL_ABBREVIATIONS = frozenset(
    """
    jr sr inc ltd corp esq messrs ibid approx viz cf ave blvd dept univ mme mlle lbs yds vols figs a.m
    p.m adj adv prep conj pron interj
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


# Left out before anything else: emoticons (":-)", ";P") and labels that open a sentence ("Q:", "A.", "a)", "(iv)",
# "qotd:"); an engine says them as letters, words or punctuation names.
_EMOTICON = re.compile(r"(?<!\S)(?:[:;=][-o^']?[()\[\]DPp|\\/*]+|[()][-^]?[:;])(?=[\s.,;!?]|$)")
_LABEL = re.compile(r"^(?:[QA][:.]|\(?(?:[a-z]|[ivx]{1,4})\)|(?i:qotd):)\s+")

# The words of a spoken form: letters with apostrophes or hyphens inside; what lies between them is punctuation.
_WORD = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*")
_CONTRACTION_ENDS = frozenset({"s", "t", "d", "m", "ll", "ve", "re"})  # "'s", "n't", "'ll" after an apostrophe
_VOWEL = re.compile(r"[aeiouAEIOU]|(?<=.)[yY]")  # "y" counts after the first letter ("my", not "yd")
_LETTER_THRICE = re.compile(r"([A-Za-z])\1\1")
# flite and festival read "I", "V" and "X" as numbers after a king's name or a word like "book" (flite's us_text.c
# rex_like / section_like, festival's token.scm); "V" and "X" alone are numerals or letters, never both safely.
_NUMERAL_AFTER = frozenset(
    """
    louis henry charles philip george edward pius william richard ptolemy john paul peter nicholas frederick
    james alfonso ivan napoleon leo gregory catherine alexandria pierre elizabeth mary king queen pope duke
    section chapter part phrase verse scene act book volume chap war apollo trek fortran
    """.split()  # noqa: SIM905 (a word list reads better as text)
)
# flite's US state abbreviations (us_text.c): the first set is always expanded ("Ca" -> "california"), the
# second after a capitalised word when a lower-case word, nothing or a full stop follows ("Boston Mass?").
_STATES = frozenset("Ak Ala Az Ca Calif Colo Fla Ga Kans Ks Nev Okla Wyo".split())  # noqa: SIM905
_AMBIGUOUS_STATES = frozenset(
    """
    Al Cal Co De Del Fl Hi Ia Il Ind Ky La Lou Lous Ma Mass Md Me Mi Mich Minn Miss Mo Mt Ne Neb Or Ore Pa
    Penn Tex Tn Tenn Tx Wa Wash Wi Wy
    """.split()  # noqa: SIM905 (a word list reads better as text)
)
# Abbreviations without their period that an engine expands or spells ("dept" -> "department", "adj" -> "a d j");
# "etc" is said "et cetera" by every engine, so it is written so.
_BARE_ABBREVIATIONS = frozenset({"adj", "adv", "apr", "dept", "esq", "est", "mlle", "mme"})
_BARE_EXPAND = {"etc": "et cetera"}


def _pause(gap: str) -> str:
    """The punctuation a gap between two words (or after the last) is said with: a clause mark or nothing."""
    gap = re.sub(r"\.{2,}", ",", gap)  # an ellipsis is a pause
    for mark in "?!.;:":
        if mark in gap:
            return mark
    return "," if re.search(r"[,()-]", gap) else ""


def _unsayable_word(word: str, before: str, after: str | None, gap_after: str) -> bool:
    """Whether an engine would say ``word`` as something else (see the module docstring); ``before`` and ``after``
    are the neighbouring words ("" / None at the ends), ``gap_after`` the punctuation that follows it."""
    parts = []
    for piece in word.split("-"):
        head, *tails = piece.split("'")
        parts += [head, *(t for t in tails if t.lower() not in _CONTRACTION_ENDS)]
    for part in parts:
        if len(part) >= 2 and (not _VOWEL.search(part) or part[1:] != part[1:].lower()):
            return True  # spelled or expanded ("Mr", "hmm"), or spelled / split ("CDs", "MacDonald")
    if _LETTER_THRICE.search(word) or word.lower() in _BARE_ABBREVIATIONS:
        return True
    if word in ("V", "X") or (word == "I" and before.lower() in _NUMERAL_AFTER):
        return True
    pieces = word.split("-")  # flite reads each piece of a hyphenated word on its own, in the word's context
    if any(piece in _STATES for piece in pieces):
        return True
    return (
        any(piece in _AMBIGUOUS_STATES for piece in pieces)
        and len(before) > 2
        and before[:1].isupper()
        and (after is None or after[:1].islower() or "." in gap_after)
    )


def _words_and_pauses(text: str) -> str | None:
    """``text`` as the words of its transcript with clause punctuation only, or None when an engine would say
    something else than those words (glued punctuation, spelled or expanded words)."""
    matches = list(_WORD.finditer(text))
    if not matches:
        return None
    words = [m.group(0) for m in matches]
    gaps = [text[a.end() : b.start()] for a, b in itertools.pairwise(matches)] + [text[matches[-1].end() :]]
    out = []
    for i, (word, gap) in enumerate(zip(words, gaps, strict=True)):
        after = words[i + 1] if i + 1 < len(words) else None
        if after is not None and not re.search(r"\s", gap) and not re.fullmatch(r"(?:\.{2,}|[()\"])+", gap):
            return None  # punctuation glued between two words ("comp.unix", "a:b", "U.S."): said as "dot", ...
        if _unsayable_word(word, words[i - 1] if i else "", after, gap):
            return None
        out.append(_BARE_EXPAND.get(word.lower(), word) + _pause(gap))
    return " ".join(out)


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
    text = _LABEL.sub("", " ".join(_EMOTICON.sub(" ", text).split()))
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
    if len(shouted) == 1:
        return None  # one capitalised word is an acronym ("UNIX", "QOTD"), read as a word or spelled
    for word in shouted:  # shouted words ("DON'T PANIC") are said as words
        text = re.sub(rf"\b{re.escape(word)}\b", word.lower(), text)
    return _words_and_pauses(text)


# A heading word and its number, as people write chapter titles ("CHAPTER XXII", "Book IV", "CHAPTER 23"): the
# word in lower case (a capitalised one reads as an acronym), a Roman numeral as a number.
_HEADING = re.compile(r"\b(chapter|book|part|volume|section)\s+([MDCLXVI]+|\d+)\b(\.?)", re.IGNORECASE)
_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def roman_value(numeral: str) -> int | None:
    """The value of a well-formed Roman numeral (``"XXII"`` -> 22), or None."""
    numeral = numeral.upper()
    if not numeral or not (_ROMAN.match(numeral) or numeral in ("I", "V", "X", "L", "C", "D", "M")):
        return None
    values = [_ROMAN_VALUES[c] for c in numeral]
    return sum(-v if i + 1 < len(values) and v < values[i + 1] else v for i, v in enumerate(values))


def verbalize_transcript(text: str) -> str | None:
    """A transcript written as people write it (a machine transcript: "Chapter 1. Mrs. Linde paid $5."), as the
    words that were said, normalised as training targets are ("chapter one missus linde paid five dollars"); None
    when :func:`verbalize` cannot say it unambiguously, so that a training set drops it rather than learn a guess.

    Beyond :func:`verbalize`: a heading word and its number ("CHAPTER XXII", "CHAPTER 23") read as a word and a
    number, and "Ms." as "miz"."""
    from srupp_asr.text import normalize_text

    def heading(match: re.Match) -> str:
        word, number, period = match.groups()
        if number in ("I", "i") and not period and not word.isupper():
            return match.group(0)  # "the part I liked", "a book I read": the pronoun
        value = int(number) if number.isdigit() else roman_value(number)
        return match.group(0) if value is None else f"{word.capitalize()} {number_words(value)}{period}"

    text = _HEADING.sub(heading, text)
    text = re.sub(r"(?<![\w.])Ms\.(?=\s)", "Miz", text)
    spoken = verbalize(text)
    return None if spoken is None else normalize_text(spoken)
