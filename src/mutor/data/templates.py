"""The paper's prompt/completion templates, one per dataset, shared by training and evaluation.

Training builds ``prompt + completion + eos`` with the loss on the completion only;
evaluation feeds exactly the same ``prompt`` and decodes greedily. Keeping both in one
table is what makes "prompts identical to the training templates" true by construction.

Each :class:`TextTemplate` names its Hub dataset (loaded with ``datasets.load_dataset`` by the
user's machine; nothing is downloaded in tests), the split used for each role, the paper's
``max_length`` filter and the field holding the gold answer of an example (how answers are
scored is :class:`mutor.eval.benchmarks.Benchmark`'s). Templates are ``str.format`` strings over
the dataset's own fields, after an optional ``prepare`` step that derives extra fields
(AQUA-RAT's option list).

The paper (appendix A) gives the GSM8K template (``"Question: {question}\\n\\nAnswer:"`` then
``" " + answer + eos``) and the summarization one (``"Dialogue:\\n{dialogue}\\n\\nSummary:"``).
OpenMathInstruct-2 and AQUA-RAT use the same Question/Answer shape; the AQUA-RAT completion
ends with ``"The answer is X"`` so that the option letter can be read off the generation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

__all__ = ["TextTemplate", "TEMPLATES", "get_template", "render_prompt", "render_completion", "reference_answer"]


def _identity(ex: dict) -> dict:
    return ex


def _aqua_prepare(ex: dict) -> dict:
    """AQUA-RAT options come as ``["A)21", "B)21.5", ...]``: one line each, ``A) 21``."""
    opts = [re.sub(r"^\s*([A-E])\s*\)\s*", r"\1) ", o) for o in ex["options"]]
    return {**ex, "options_text": "\n".join(opts)}


def _omi2_source(sources: tuple[str, ...]) -> Callable[[dict], bool]:
    def keep(ex: dict) -> bool:
        return ex.get("problem_source") in sources

    keep.__name__ = f"problem_source_in_{'_'.join(sources)}"
    return keep


@dataclass(frozen=True)
class TextTemplate:
    """One text dataset as the paper uses it: where it lives, which splits, how an example is rendered."""

    name: str
    hub_id: str
    prompt: str                                   # str.format over the (prepared) example
    completion: str                               # ditto; starts with the separator (" " or "\n")
    answer_field: str                             # the gold answer the metric compares against
    splits: dict = field(default_factory=dict)    # role ("train"/"validation"/"test") -> Hub split name
    hub_config: Optional[str] = None
    max_length: int = 512                         # the paper drops longer training examples (tokens)
    max_new_tokens: int = 512                     # generation budget at evaluation
    prepare: Callable[[dict], dict] = _identity   # derives template fields from a raw example
    filter: Optional[Callable[[dict], bool]] = None   # keep an example (OpenMathInstruct-2 subsets)
    sample: Optional[int] = None                  # keep this many after filtering (1M-MATH: 200K) ...
    sample_seed: int = 0                          # ... drawn with this seed (datasets' shuffle)
    selection: str = "best_test"                  # checkpoint selection: "validation" or "best_test"
    notes: str = ""

    def has_split(self, role: str) -> bool:
        """Whether the task has a Hub split for ``role`` (``"train"``, ``"validation"`` or ``"test"``)."""
        return self.splits.get(role) is not None


_QA_PROMPT = "Question: {question}\n\nAnswer:"
_OMI2_PROMPT = "Question: {problem}\n\nAnswer:"
_DIALOGUE_PROMPT = "Dialogue:\n{dialogue}\n\nSummary:"

TEMPLATES: dict[str, TextTemplate] = {}


def _add(template: TextTemplate) -> None:
    TEMPLATES[template.name] = template


_add(TextTemplate(
    name="gsm8k", hub_id="openai/gsm8k", hub_config="main",
    prompt=_QA_PROMPT, completion=" {answer}", answer_field="answer",
    splits={"train": "train", "validation": None, "test": "test"}, max_length=512, max_new_tokens=512,
    notes="GSM8K solutions end with '#### <number>'; the metric reads that, else the last number."))
_add(TextTemplate(
    name="omi2_1m_gsm", hub_id="nvidia/OpenMathInstruct-2",
    prompt=_OMI2_PROMPT, completion=" {generated_solution}", answer_field="expected_answer",
    splits={"train": "train_1M", "validation": None, "test": None},
    filter=_omi2_source(("gsm8k", "augmented_gsm8k")), max_length=512,
    notes="1M-GSM: OpenMathInstruct-2's 1M split, GSM-derived problems (~152K); evaluate on gsm8k."))
_add(TextTemplate(
    name="omi2_2m_gsm", hub_id="nvidia/OpenMathInstruct-2",
    prompt=_OMI2_PROMPT, completion=" {generated_solution}", answer_field="expected_answer",
    splits={"train": "train_2M", "validation": None, "test": None},
    filter=_omi2_source(("gsm8k", "augmented_gsm8k")), max_length=512,
    notes="2M-GSM: OpenMathInstruct-2's 2M split, GSM-derived problems (~277K); evaluate on gsm8k."))
_add(TextTemplate(
    name="omi2_1m_math", hub_id="nvidia/OpenMathInstruct-2",
    prompt=_OMI2_PROMPT, completion=" {generated_solution}", answer_field="expected_answer",
    splits={"train": "train_1M", "validation": None, "test": None},
    filter=_omi2_source(("math", "augmented_math")), sample=200_000, sample_seed=0, max_length=768,
    notes="1M-MATH: OpenMathInstruct-2's 1M split, MATH-derived problems, 200K sampled with a fixed seed; "
          "evaluate on math500."))
_add(TextTemplate(
    name="math500", hub_id="HuggingFaceH4/MATH-500",
    prompt=_OMI2_PROMPT, completion=" {solution}", answer_field="answer",
    splits={"train": None, "validation": None, "test": "test"}, max_length=768, max_new_tokens=768,
    notes="Evaluation only (train on omi2_1m_math); the last \\boxed{} answer is compared with math-verify."))
_add(TextTemplate(
    name="aqua_rat", hub_id="deepmind/aqua_rat", hub_config="raw",
    prompt="Question: {question}\nOptions:\n{options_text}\n\nAnswer:",
    completion=" {rationale}\nThe answer is {correct}", answer_field="correct",
    splits={"train": "train", "validation": "validation", "test": "test"}, prepare=_aqua_prepare,
    max_length=512, max_new_tokens=512, selection="validation",
    notes="The best checkpoint is chosen by validation accuracy, as in the paper."))
_add(TextTemplate(
    name="samsum", hub_id="Samsung/samsum",
    prompt=_DIALOGUE_PROMPT, completion=" {summary}", answer_field="summary",
    splits={"train": "train", "validation": "validation", "test": "test"}, max_length=768,
    max_new_tokens=128, selection="validation",
    notes="The best checkpoint is chosen by validation ROUGE-L, as in the paper."))
_add(TextTemplate(
    name="dialogsum", hub_id="knkarthick/dialogsum",
    prompt=_DIALOGUE_PROMPT, completion=" {summary}", answer_field="summary",
    splits={"train": "train", "validation": "validation", "test": "test"}, max_length=768,
    max_new_tokens=128, selection="validation",
    notes="The best checkpoint is chosen by validation ROUGE-L, as in the paper."))


def get_template(name: str) -> TextTemplate:
    """The built-in text task ``name``; raise ``ValueError`` naming the known tasks if there is none."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown text task {name!r}; known tasks: {sorted(TEMPLATES)}") from None


def _format(fmt: str, ex: dict, template: TextTemplate, what: str) -> str:
    try:
        return fmt.format(**template.prepare(ex))
    except KeyError as err:
        raise ValueError(f"{template.name} {what} template needs the dataset column {err.args[0]!r}; the data has "
                         f"columns {sorted(ex)}") from None


def render_prompt(template: TextTemplate, ex: dict) -> str:
    """The prompt ``template`` renders for example ``ex``; raise ``ValueError`` naming a missing column."""
    return _format(template.prompt, ex, template, "prompt")


def render_completion(template: TextTemplate, ex: dict) -> str:
    """The completion without the eos token (the tokenizer step appends it)."""
    return _format(template.completion, ex, template, "completion")


def reference_answer(template: TextTemplate, ex: dict) -> str:
    """The gold answer of example ``ex`` that the task's metric compares generations against."""
    return str(ex[template.answer_field])
