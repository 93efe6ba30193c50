"""Chat data (``data.task: chat``): rows with a ``messages`` list of ``{"role", "content"}`` turns, the format of
TRL and ``datasets``, rendered by the tokenizer's chat template (``tokenizer.apply_chat_template``).

The loss, and MuToR's registers (they go only where labels are supervised), are on the assistant turns only:
every other token's label is -100. An assistant turn is the text the template adds between the conversation
up to that turn rendered with ``add_generation_prompt=True`` and the conversation including it: the turn's
content and whatever the template closes it with (its end-of-turn token), so the model learns to stop. Each
piece is tokenized on its own, as prompt and completion are for prompt/completion data, so the tokens of a
single-turn conversation's prompt are exactly what ``mutor eval`` feeds the model before it generates.

``mutor eval --task chat`` renders the conversation up to its last assistant turn with
``add_generation_prompt=True`` as the prompt and scores the generation against that turn's content
(:func:`chat_prompt`).

What is unusual: a template that renders a turn differently depending on what follows it (one that drops
earlier turns' reasoning, say) has no such prefixes; its conversations are refused by row, in one line.
"""

from __future__ import annotations

from typing import Optional

from ..core.layout import IGNORE_INDEX
from ..utils.errors import MutorUserError
from .registry import TrainingData, register_task

__all__ = ["CHAT_KEYS", "build_chat", "chat_prompt", "check_conversations", "encode_conversation",
           "need_chat_template"]

CHAT_KEYS = {"path", "split", "limit", "max_length", "eval_path", "eval_split", "eval_limit", "num_proc", "hub_id",
             "hub_config", "messages_field"}


def need_chat_template(tokenizer, name: Optional[str] = None) -> None:
    """Refuse a tokenizer without a chat template, in one line.

    Args:
        tokenizer: A transformers tokenizer.
        name: How to name it in the message (default: the tokenizer and where it was loaded from).

    Raises:
        MutorUserError: ``tokenizer.chat_template`` is empty.
    """
    if tokenizer is None:
        raise MutorUserError("task 'chat' needs a tokenizer with a chat template: set model.tokenizer (or "
                             "model.name_or_path)")
    if not getattr(tokenizer, "chat_template", None):
        where = getattr(tokenizer, "name_or_path", "")
        name = name or (f"the tokenizer {where!r}" if where else "the tokenizer")
        raise MutorUserError(f"task 'chat' renders conversations with the tokenizer's chat template, and {name} has "
                             "none: use a chat (instruct) model's tokenizer (model.tokenizer), or write the rows as "
                             "prompt/completion data (data.task: prompt_completion)")


def _clean(messages: list) -> list[dict]:
    """The turns as the template expects them: ``datasets`` gives every turn every key any turn has, as None."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def check_conversations(rows, field: str, path: Optional[str], what: str) -> None:
    """Refuse rows that are not conversations with an assistant turn and text in every turn, naming the file and
    the row.

    Args:
        rows: A ``datasets.Dataset``.
        field: The column holding each row's turns (``messages``).
        path: The local file the rows came from (``None``: a Hub dataset).
        what: How the user named ``path`` (``data.path``, ``--data``).

    Raises:
        MutorUserError: No such column, a row that is not a list of ``{role, content}`` turns, a row without
            an assistant turn, or a turn other than a system turn whose content is empty or only whitespace; rows
            are counted from 1 (:func:`~mutor.data.text.row_name`).
    """
    where = f"{what} {path!r}" if path else "the Hub dataset"
    if field not in rows.column_names:
        hint = ("; prompt/completion rows are data.task: prompt_completion" if "prompt" in rows.column_names else
                "; name the column with data.messages_field")
        raise MutorUserError(f"{where}: its rows have no {field!r} column (a list of {{role, content}} turns); they "
                             f"have {rows.column_names}{hint}")
    from .text import is_empty_text, row_name

    for i, messages in enumerate(rows[field]):
        if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                     and isinstance(m.get("content"), str) for m in messages):
            raise MutorUserError(f"{where}: {row_name(i, path)}: {field!r} must be a list of "
                                 f"{{\"role\": ..., \"content\": ...}} turns with text content (got {messages!r:.120})")
        if not any(m["role"] == "assistant" for m in messages):
            roles = [m["role"] for m in messages]
            raise MutorUserError(f"{where}: {row_name(i, path)} has no assistant turn in {field!r} "
                                 f"(roles {roles}); the loss is on assistant turns and mutor eval scores the last one: "
                                 "add one or remove the row")
        empty = [t for t, m in enumerate(messages) if m["role"] != "system" and is_empty_text(m["content"])]
        if empty:
            t = empty[0]
            state = "empty content" if messages[t]["content"] == "" else "only whitespace as content"
            raise MutorUserError(f"{where}: {row_name(i, path)}: turn {t + 1} of {field!r} ({messages[t]['role']}) "
                                 f"has {state}; fill it in or remove the turn (only a system turn may be empty)")


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode_conversation(tokenizer, messages: list) -> dict:
    """One conversation as ``input_ids`` and ``labels``: -100 everywhere but on the assistant turns.

    Args:
        tokenizer: A tokenizer with a chat template.
        messages: The conversation, a list of ``{"role", "content"}`` turns with at least one assistant turn.

    Returns:
        ``{"input_ids": [...], "labels": [...]}``, the tokens of the rendered conversation.

    Raises:
        ValueError: The template does not render the conversation up to each assistant turn as a prefix of the
            whole (the caller names the row).
    """
    messages = _clean(messages)
    full = _render(tokenizer, messages, False)
    spans, end = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True)
        upto = _render(tokenizer, messages[:i + 1], False)
        if not (full.startswith(upto) and upto.startswith(before) and len(before) >= end):
            raise ValueError(f"the chat template does not render the conversation up to turn {i + 1} as a prefix of "
                             "the whole, so its assistant turns cannot be told apart")
        spans.append((len(before), len(upto)))
        end = len(upto)
    ids: list[int] = []
    labels: list[int] = []
    pos = 0
    for start, stop in spans + [(len(full), len(full))]:
        context = tokenizer(full[pos:start], add_special_tokens=False)["input_ids"] if start > pos else []
        turn = tokenizer(full[start:stop], add_special_tokens=False)["input_ids"] if stop > start else []
        ids += context + turn
        labels += [IGNORE_INDEX] * len(context) + turn
        pos = stop
    return {"input_ids": ids, "labels": labels}


def chat_prompt(tokenizer, messages: list) -> tuple[str, str]:
    """What ``mutor eval`` feeds and scores for one conversation.

    Args:
        tokenizer: A tokenizer with a chat template.
        messages: The conversation; it has an assistant turn.

    Returns:
        ``(prompt, reference)``: the conversation before its last assistant turn rendered with
        ``add_generation_prompt=True`` (special tokens included: tokenize it without adding more), and that
        turn's content.
    """
    messages = _clean(messages)
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return _render(tokenizer, messages[:last], True), messages[last]["content"]


def _encoded(rows, tokenizer, field: str, path: Optional[str], what: str, max_length: int, limit, num_proc):
    """Tokenize, drop conversations longer than ``max_length``; return (dataset, n_before, n_dropped)."""
    if limit is not None:
        rows = rows.select(range(min(int(limit), len(rows))))
    from .text import row_name

    where = f"{what} {path!r}" if path else "the Hub dataset"

    def encode(ex, i):
        try:
            return encode_conversation(tokenizer, ex[field])
        except Exception as err:          # the template's own refusal (roles must alternate, ...) or no prefixes
            raise MutorUserError(f"{where}: {row_name(i, path)}: {type(err).__name__}: "
                                 f"{str(err).splitlines()[0] if str(err) else ''}") from None

    enc = rows.map(encode, with_indices=True, remove_columns=rows.column_names, num_proc=num_proc,
                   desc="tokenizing")
    n = len(enc)
    enc = enc.filter(lambda ex: len(ex["input_ids"]) <= max_length, num_proc=num_proc)
    return enc, n, n - len(enc)


@register_task("chat")
def build_chat(options: dict, tokenizer, seed: int) -> TrainingData:
    """Conversations rendered by the tokenizer's chat template, the loss on assistant turns only."""
    from .registry import check_options
    from .text import load_rows, pad_id_of

    check_options(options, CHAT_KEYS, "chat")
    need_chat_template(tokenizer)
    if tokenizer.eos_token_id is None:
        raise MutorUserError(f"the tokenizer {type(tokenizer).__name__} has no eos token; generation stops at it")
    field = options.get("messages_field", "messages")
    max_length = int(options.get("max_length", 512))

    def rows_for(path, split, what):
        rows = load_rows(path, options.get("hub_id"), options.get("hub_config"), split, what=what)
        if len(rows) == 0:
            raise MutorUserError(f"{what} {path!r}: no rows")
        check_conversations(rows, field, path, what)
        return rows

    rows = rows_for(options.get("path"), options.get("split", "train"), "data.path")
    train, n, dropped = _encoded(rows, tokenizer, field, options.get("path"), "data.path", max_length,
                                 options.get("limit"), options.get("num_proc"))
    if len(train) == 0:
        raise MutorUserError(f"task 'chat': all {n} training conversations are longer than max_length={max_length} "
                             "tokens and were dropped; nothing to train on (raise data.max_length?)")
    info = {"num_examples": len(train), "dropped_too_long": dropped, "max_length": max_length, "loaded": n}
    eval_ds = None
    if options.get("eval_path") is not None or options.get("eval_split") is not None:
        eval_rows = rows_for(options.get("eval_path"), options.get("eval_split"), "data.eval_path")
        eval_ds, _, d_e = _encoded(eval_rows, tokenizer, field, options.get("eval_path"), "data.eval_path",
                                   max_length, options.get("eval_limit"), options.get("num_proc"))
        info.update(eval_examples=len(eval_ds), eval_dropped_too_long=d_e)
    return TrainingData(train_dataset=train, eval_dataset=eval_ds, pad_token_id=pad_id_of(tokenizer),
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                        max_length=max_length, info=info)
