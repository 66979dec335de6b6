"""Checks of configuration values, shared by the constructors that consume them.

A constructor (an encoder, the decoder, the subsampling, the frontend, the LM, the data module, the Lightning module)
checks its own arguments with these helpers, so a bad value is a :class:`ConfigValueError` naming the argument instead
of a ``ZeroDivisionError`` deep inside PyTorch or a network silently built without layers. A caller that passes a
config block on renames the option with :func:`config_options` (``num_heads`` -> ``encoder_conf.num_heads``), and the
entry points (``srupp-asr train``, model and LM loading) turn the error into a one-line
:class:`~srupp_asr.errors.UserError` naming the file or the command-line option.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

MAX_SIZE = 1 << 20  # a layer width or count above this is a typo (it would overflow or exhaust memory)
# The largest LM (fusion) weight taken. Scores are float32: a weight finite in float64 but not float32 (1e300), or
# one whose product with a log-probability overflows float32 (3.4e38), makes every score -inf and every transcript
# empty; weights past 1,000 already leave the acoustic model no say (ESPnet's recipes use 0.1-1).
MAX_LM_WEIGHT = 1000.0


class ConfigValueError(ValueError):
    """A configuration value out of its range: ``option`` names it as a config spells it, ``problem`` says what is
    wrong (``str(err)`` is ``"<option> <problem>"``)."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"{option} {problem}")
        self.option, self.problem = option, problem


def is_real_number(value: object) -> bool:
    """An int or a float, not a bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(option: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` if it is an integer (not a bool) in ``[minimum, maximum]``, else a ConfigValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigValueError(option, f"must be an integer, got {value!r}")
    if value < minimum:
        wanted = "non-negative" if minimum == 0 else f"at least {minimum}"
        raise ConfigValueError(option, f"must be {wanted}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigValueError(option, f"must be at most {maximum}, got {value}")
    return value


def check_size(option: str, value: Any) -> int:
    """``value`` if it is a usable layer width or count: an integer from 1 to :data:`MAX_SIZE`."""
    return check_int(option, value, 1, MAX_SIZE)


def check_even_size(option: str, value: Any, why: str) -> int:
    """``value`` if it is an even :func:`check_size` (``why``: what needs it even)."""
    if check_size(option, value) % 2:
        raise ConfigValueError(option, f"must be even ({why}), got {value}")
    return value


def check_number(
    option: str,
    value: Any,
    *,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    at_most: float | None = None,
) -> float:
    """``value`` if it is a finite number (int or float, not a bool) within the bounds given, else a
    ConfigValueError (``dropout``: ``at_least=0, below=1``)."""
    bounds = [(">", above, float.__gt__), (">=", at_least, float.__ge__)]
    bounds += [("<", below, float.__lt__), ("<=", at_most, float.__le__)]
    bounds = [(sign, float(limit), test) for sign, limit, test in bounds if limit is not None]
    number = is_real_number(value) and math.isfinite(value)
    if not number or not all(test(float(value), limit) for _, limit, test in bounds):
        wanted = " and ".join(f"{sign} {limit:g}" for sign, limit, _ in bounds)
        raise ConfigValueError(option, f"must be a finite number{' ' + wanted if wanted else ''}, got {value!r}")
    return value


def check_probability(option: str, value: Any) -> float:
    """``value`` if it is a dropout-like probability in ``[0, 1)``."""
    return check_number(option, value, at_least=0.0, below=1.0)


def check_choice(option: str, value: Any, choices: Collection[Any]) -> Any:
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ConfigValueError(option, f"must be one of [{', '.join(map(str, choices))}], got {value!r}")
    return value


def check_divides(option: str, value: Any, other: str, other_value: int) -> int:
    """``value`` if it is a positive integer dividing ``other_value`` (the value of option ``other``): attention
    heads must split the attention width evenly."""
    check_size(option, value)
    if other_value % value:
        raise ConfigValueError(option, f"must divide {other} ({other_value}), got {value}")
    return value


def check_keywords(target: Callable[..., Any], given: Mapping[str, Any], internal: Collection[str] = ()) -> None:
    """A ConfigValueError naming the first key of ``given`` that ``target`` takes no keyword argument for (or that is
    one of its ``internal`` ones, set by the caller, not by a config)."""
    valid = [p for p in inspect.signature(target).parameters if p not in internal]
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ConfigValueError(unknown[0], f"is not an option (valid options: {', '.join(valid)})")


@contextmanager
def config_options(block: str = "", names: Mapping[str, str] | None = None) -> Iterator[None]:
    """Re-raise a ConfigValueError from the body under the name a config gives the option: renamed by ``names``
    (a constructor's ``factor`` is the model's ``subsampling``), then prefixed with ``block.``."""
    try:
        yield
    except ConfigValueError as err:
        option = (names or {}).get(err.option, err.option)
        raise ConfigValueError(f"{block}.{option}" if block else option, err.problem) from None


def lm_weight_problem(value: object) -> str | None:
    """What is wrong with ``value`` as an LM (fusion) weight, or None: it must be a number in [0,
    :data:`MAX_LM_WEIGHT`] (so finite in float32, and its products with log-probabilities too). Here, below both
    the LM (which records its weight) and the decoding options (which take one)."""
    if is_real_number(value) and 0 <= value <= MAX_LM_WEIGHT:
        return None
    return f"must be a number in [0, {MAX_LM_WEIGHT:g}], got {value!r}"
