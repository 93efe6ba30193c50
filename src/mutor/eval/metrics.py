"""Answer extraction and scoring, one pure function per benchmark, as the paper measures them.

* GSM8K (and the OpenMathInstruct-2 GSM subsets): the number after the last ``####`` (the GSM8K
  convention), else the last number in the text; commas, ``$``, a trailing period and ``.0`` are
  normalised, and answers are compared as exact rationals (``3.50 == 3.5``, ``1/2 == 0.5``).
* MATH500: the last ``\\boxed{...}`` (or ``\\fbox{...}``) of the generation, compared with the gold
  answer by ``math-verify`` (symbolic equivalence: ``\\frac12``, ``\\dfrac{1}{2}`` and ``0.5`` agree).
* AQUA-RAT: the chosen option letter (``The answer is C``, ``answer is (C)``, else the last ``C)``).
* SAMSum / DialogSum: ROUGE-1/2/L F-measures from ``rouge-score`` with stemming, as percentages.
* Your own data (``prompt_completion``, ``chat``): exact match after whitespace normalisation (ends stripped,
  every run of whitespace one space), as a percentage.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Optional

__all__ = ["extract_gsm8k", "gsm8k_correct", "last_boxed", "math_correct", "extract_choice", "aqua_correct",
           "rouge_scores", "normalize_whitespace", "exact_match"]

_NUM = re.compile(r"-?\s*\$?\s*\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")


def _to_fraction(text: str) -> Optional[Fraction]:
    s = text.replace(",", "").replace("$", "").replace(" ", "")
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return Fraction(Decimal(num)) / Fraction(Decimal(den)) if Decimal(den) != 0 else None
        return Fraction(Decimal(s))
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None


def _canonical(f: Fraction) -> str:
    if f.denominator == 1:
        return str(f.numerator)
    d = Decimal(f.numerator) / Decimal(f.denominator)
    return format(d.normalize(), "f") if len(str(d)) < 30 else f"{f.numerator}/{f.denominator}"


def extract_gsm8k(text: str) -> Optional[str]:
    """The final numeric answer of a GSM8K-style solution, canonicalised (``"1234"``, ``"-3"``, ``"3.5"``)."""
    if text is None:
        return None
    tail = text.rsplit("####", 1)[1] if "####" in text else text
    nums = _NUM.findall(tail)
    if not nums:
        return None
    f = _to_fraction(nums[0] if "####" in text else nums[-1])
    return None if f is None else _canonical(f)


def gsm8k_correct(generation: str, reference: str) -> bool:
    """Whether the generation's answer equals the reference's as numbers (see :func:`extract_gsm8k`)."""
    pred, gold = extract_gsm8k(generation), extract_gsm8k(reference)
    return pred is not None and gold is not None and _to_fraction(pred) == _to_fraction(gold)


def last_boxed(text: str) -> Optional[str]:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}`` (nested braces handled), or None."""
    if text is None:
        return None
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    i, depth = starts[-1], 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


# math-verify's own limits (5 s per parse and per comparison) count wall-clock seconds through SIGALRM, so on a
# loaded machine a correct answer could be scored wrong by timing out; these are far above any honest parse.
MATH_VERIFY_TIMEOUT_S = 60


def math_correct(generation: str, reference: str) -> bool:
    """math-verify equivalence of the last boxed answer with the gold answer (itself boxed or bare LaTeX)."""
    from math_verify import parse, verify

    pred = last_boxed(generation)
    if pred is None:
        return False
    gold = last_boxed(reference)
    gold = reference.strip() if gold is None else gold
    try:
        t = MATH_VERIFY_TIMEOUT_S
        gold_expr = parse(f"\\boxed{{{gold}}}", parsing_timeout=t)
        return bool(verify(gold_expr, parse(f"\\boxed{{{pred}}}", parsing_timeout=t), timeout_seconds=t))
    except Exception:  # math-verify raises on some malformed LaTeX; that is a wrong answer, not a crash
        return False


def extract_choice(text: str, letters: str = "ABCDE") -> Optional[str]:
    """The option letter a generation picks: the last "answer is (X)", else the last "X)", else None."""
    if text is None:
        return None
    found = re.findall(rf"answer is\s*:?\s*\(?([{letters}])\b", text, flags=re.IGNORECASE)
    if found:
        return found[-1].upper()
    found = re.findall(rf"\b([{letters}])\)", text)
    return found[-1] if found else None


def aqua_correct(generation: str, reference: str) -> bool:
    """Whether the generation's chosen option letter matches the reference's first letter (AQuA-RAT)."""
    pred = extract_choice(generation)
    return pred is not None and pred == reference.strip().upper()[:1]


_SCORER = None


def rouge_scores(generation: str, reference: str) -> dict:
    """ROUGE-1/2/L F-measures (percent) of one summary, with Porter stemming (rouge-score)."""
    global _SCORER
    if _SCORER is None:
        from rouge_score import rouge_scorer

        _SCORER = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    s = _SCORER.score(reference, generation or "")
    return {k: 100.0 * v.fmeasure for k, v in s.items()}


def normalize_whitespace(text: str) -> str:
    """``text`` with its ends stripped and every run of whitespace (newlines included) made one space."""
    return " ".join(text.split())


def exact_match(generation: str, reference: str) -> bool:
    """Whether the generation is the reference, up to whitespace (:func:`normalize_whitespace`)."""
    return normalize_whitespace(generation) == normalize_whitespace(reference)
