"""Registers as drafters: lossless self-speculative decoding (greedy or sampled) from a MuToR-trained model.

A trained register after ``x_t`` predicts ``x_{t+d}`` from ``x_<=t`` at position ``t+d-1``, in the
same forward as the next-token prediction and with no extra head: a free draft of K-1 tokens per
forward. Each forward here feeds

    [ x_e (the newest accepted token) , g_2 .. g_K (its draft) ]  +  K-1 registers after each of them

Regular tokens never see registers (the training rule, ``layout.py``), so the regular logits are those
of the plain model and greedy verification is exact: a draft token is kept while it equals the
model's own greedy choice at that place, then the model's choice at the first mismatch (or after the
last draft) is appended for free. The registers after the last kept token draft the next round. The
output is token for token the plain model's greedy decoding, whatever the registers learned; they only
decide how many tokens one forward yields.

With ``do_sample=True`` the draft tokens are drawn from the registers' distributions and verified by
speculative sampling (accept with probability min(1, p/q), else draw from the residual), so the output
follows the model's own sampling distribution exactly.

Whether drafting pays in wall-clock time depends on the registers and on the machine: a forward of K^2 rows
costs little more than one row where a forward is bound by reading the weights (bf16 on a CPU, a GPU) and
more elsewhere (float32 on a CPU: a one-row product takes a faster path, and a forward of a few rows can cost
two to three of one). ``draft_registers="auto"`` (the default) therefore picks each round's draft length,
and whether registers follow every fed token or only the last one (fewer rows; a rejected draft then leaves
the next round without one), from the recent acceptance and the measured cost of a forward by its rows
(``draft_choice.py``), and decodes plainly, one token per forward, when no draft pays. A draft stops before
its first eos (when the draft is right, the model's own next token is that eos, so feeding it saves nothing)
and at ``max_new_tokens``; then no register follows its last token.

The cache is a plain ``DynamicCache`` of full layers (sliding windows are applied through the mask on
position ids, as in training), built here so that no layer evicts entries on its own; after each
forward it is cropped to the kept regular tokens, so register keys and values never stay in it.
Batch size 1; eager and sdpa attention (a FlexAttention BlockMask cannot be sliced to the new rows).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from transformers import DynamicCache

from ..core.config import check_prefix_attention
from ..core.layout import RegisterLayout
from ..core.masks import build_attention_mask
from ..methods.mutor import MuToRModel
from ..utils.devices import cache_argument
from .draft_choice import DraftLength, DraftStats


def _register_vectors(model: MuToRModel, offsets: list[int]) -> torch.Tensor:
    """(K-1, C) the register embedding for each drafting offset (per-offset vectors where trained)."""
    cfg = model.mutor_config
    dtype = model.base_model.get_input_embeddings().weight.dtype
    vectors = lambda rows: model.register_inputs(torch.tensor(rows, device=model.device), dtype)   # noqa: E731
    if cfg.register_embedding == "shared":
        return vectors([0] * len(offsets))
    choices = [c[0] for c in cfg.offset_choices()]
    missing = [d for d in offsets if d not in choices]
    if missing:
        raise ValueError(f"draft offsets {missing} have no trained per-offset register (trained offsets: {choices}); "
                         f"use draft_registers <= {max(choices)}")
    return vectors([choices.index(d) for d in offsets])


def _step_mask(model: MuToRModel, past: int, m: int, src: torch.Tensor, reg_pos: torch.Tensor, dtype, prompt_len: int):
    """Mask rows of the new queries ([m regular tokens; R registers]) over keys [past + m regular; R registers].

    ``prompt_len`` > 0: the prompt attends to itself both ways (bidirectional prefix), generated tokens causally."""
    dev = src.device
    n, R = past + m, src.numel()
    L = n + R
    ar = torch.arange(n, device=dev)
    limit = torch.where(ar < prompt_len, prompt_len - 1, ar)                         # (n,)
    pos = torch.cat([ar, reg_pos])[None]                                             # (1, L)
    lay = RegisterLayout(
        position_ids=pos, doc_ids=torch.zeros(1, L, dtype=torch.long, device=dev),
        limit=torch.cat([limit, limit[past + src]])[None],                           # a register sees what x_src sees
        key_ok=torch.cat([torch.ones(n, dtype=torch.bool, device=dev), torch.zeros(R, dtype=torch.bool, device=dev)])[None],
        ntp_labels=torch.empty(1, n, dtype=torch.long, device=dev), reg_source=src[None], reg_labels=src[None],
        reg_choice=torch.zeros(1, R, dtype=torch.long, device=dev), reg_valid=torch.ones(1, R, dtype=torch.bool, device=dev),
        offset_index=torch.zeros(1, dtype=torch.long, device=dev))
    full = build_attention_mask(lay, model.attn_implementation, model.windows, dtype)
    rows = lambda t: t[:, :, past:]                                                   # (1, 1, m+R, L)
    return (rows(full) if torch.is_tensor(full) else {k: rows(v) for k, v in full.items()}), pos[:, past:]


@torch.no_grad()
def generate(
    model: Union[MuToRModel, str],
    input_ids: torch.Tensor,
    max_new_tokens: int = 64,
    draft_registers: Optional[Union[int, str, "DraftLength"]] = None,
    eos_token_id: Optional[Union[int, list[int]]] = None,
    prefix_attention: Optional[str] = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, DraftStats]:
    """Decode one prompt with the registers as drafters: lossless self-speculative decoding.

    The output is token for token the model's own greedy decoding (``do_sample=False``), or distributed
    exactly as its own sampling (``do_sample=True``); the registers decide only how many tokens a forward yields.
    Each round: one forward of the pending tokens, their draft and its registers (:func:`_draft_forward`),
    verification of the draft against the model's own choices (:func:`_verify`, :func:`_verify_sampled`), the
    cache cropped to the kept tokens, the new tokens emitted (:func:`_emit`), and the registers after the newest
    kept token read as the next draft.

    Args:
        model: A :class:`MuToRModel` trained with 1D offsets, or the directory of a MuToR checkpoint (the
            vanilla model plus its sidecar). Its attention must be ``sdpa`` or ``eager``.
        input_ids: The prompt, shape (1, n): batch size 1.
        max_new_tokens: The most tokens to generate (>= 1).
        draft_registers: ``"auto"`` or None (the default): each round's draft length K in 1..d_max chosen for the
            most tokens per second (:class:`~mutor.integrations.draft_choice.DraftLength`: running acceptance,
            measured cost per forward), so that poor registers or costly extra rows fall back to plain decoding.
            A ``DraftLength`` instance does the same and keeps what it learned across calls: pass one instance
            for every prompt of an evaluation, so that short answers do not each pay for timing every length.
            An integer K drafts offsets 2..K after every kept token (K = 1 is plain decoding, one token per
            forward).
        eos_token_id: Stop after this token (or any of a list); default: the model's generation config.
        prefix_attention: ``"bidirectional"`` lets the prompt see itself both ways, as the evaluation harness
            decodes a bidirectional-prefix run; ``"causal"``; default: the model's training setting.
        do_sample: Speculative sampling from the model's distribution at ``temperature`` (no top-k / top-p),
            with the registers' distributions at the same temperature as the draft distributions.
        temperature: Sampling temperature (> 0); used only with ``do_sample``.
        generator: Random numbers for sampling.

    Returns:
        ``(ids, stats)``: ``ids`` (1, n + new) is the prompt followed by the generated tokens (up to and
        including the first eos); ``stats`` the :class:`~mutor.integrations.draft_choice.DraftStats` of the run.

    Raises:
        TypeError: ``model`` is neither a ``MuToRModel`` nor a directory.
        ValueError: An argument out of range, a batch larger than 1, a model trained with 2D offsets, an
            attention backend other than sdpa / eager, or per-offset registers not trained for an offset drafted.
    """
    model, K, prompt_len, eos = _checked_arguments(model, input_ids, max_new_tokens, draft_registers,
                                                   eos_token_id, prefix_attention)
    if do_sample and not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature!r}")
    base, dev = model.base_model, model.device
    was_training = base.training
    base.eval()
    emb = base.get_input_embeddings()
    all_vec = _register_vectors(model, list(range(2, K + 1))) if K > 1 else None     # (K-1, C)
    length = (draft_registers if isinstance(draft_registers, DraftLength)
              else DraftLength(K, fixed=None if draft_registers in (None, "auto") else K))
    ids = input_ids.to(dev)
    out_ids = ids[0].tolist()
    cache = DynamicCache()
    stats = DraftStats()
    pending, draft = ids[0], []                                                        # pending: kept, not in the cache
    q = None                                                                           # (len(draft), V) when sampling
    clock = length.timer()
    try:
        while stats.new_tokens < max_new_tokens:
            room = max_new_tokens - stats.new_tokens - 1           # tokens this round may emit after its first
            usable, at_eos = _until_end(draft, eos, room, do_sample)   # what of the draft could be fed
            first = stats.forwards == 1                            # the draft is the prompt's registers'
            ends = at_eos or len(usable) >= room                   # kept whole, it ends decoding
            k, tail = (length.prompt_round(), False) if stats.forwards == 0 else length.choose(len(usable), first, ends)
            if usable and not do_sample:                           # fed or not, the decoded tokens settle it
                length.watch(usable, first)
            (draft, at_eos), offsets = _until_end(draft[:k - 1], eos, room, do_sample), list(range(2, k + 1))
            q = q[:len(draft)] if q is not None and draft else None
            last = at_eos or len(draft) >= room        # keeping every draft ends decoding (as the draft foresees)
            reg_vec = all_vec[:k - 1] if offsets else None
            t0 = clock()
            logits, m, a, ends = _draft_forward(model, emb, reg_vec, offsets, cache, pending, draft, prompt_len,
                                                tail, last)                              # (m-a+R, V)
            if do_sample:                                          # kept drafts, then a token drawn from p
                kept, nxt = _verify_sampled(draft, q, logits[:m - a], temperature, generator, stats)
            else:                                                  # the model's own choice after feed[a], feed[a+1], ...
                greedy = logits[:m - a].argmax(-1).tolist()
                kept = _verify(draft, greedy, stats)
                nxt = greedy[kept]
            if stats.forwards:                                     # the prompt's round is no measure of a step
                length.record(m + len(ends) * len(offsets), clock() - t0)
            else:                                                  # but it prices the prompt's registers
                length.record_prompt(m + len(ends) * len(offsets), clock() - t0)
            stats.forwards += 1
            stats.rounds[k] = stats.rounds.get(k, 0) + 1
            stats.tail_rounds += tail
            if do_sample:                                          # sampled drafts: kept with probability min(1, p/q)
                length.observe(len(draft), kept, first)
            new = draft[:kept] + [nxt]
            length.emitted(new)
            cache.crop(-(logits.shape[0] - kept - 1))              # keep regular tokens up to the newest kept; no registers
            if _emit(new, out_ids, stats, max_new_tokens, eos):    # tokens cut at max_new_tokens / eos leave too
                cache.crop(-(cache.get_seq_length() - (len(out_ids) - 1)))
                break
            pending, draft, q = torch.tensor([nxt], device=dev), [], None
            if a + kept in ends:                                   # the registers after x_e, the newest kept token
                r0 = m - a + ends.index(a + kept) * len(offsets)
                reg = logits[r0:r0 + len(offsets)]                                     # (K-1, V)
                if do_sample:
                    q = torch.softmax(reg.float() / temperature, -1)
                    draft = torch.multinomial(q, 1, generator=generator)[:, 0].tolist()
                else:
                    draft = reg.argmax(-1).tolist()
    finally:
        length.flush()
        base.train(was_training)
    return torch.tensor([out_ids], device=dev), stats


def _checked_arguments(
    model: Union[MuToRModel, str],
    input_ids: torch.Tensor,
    max_new_tokens: int,
    draft_registers: Optional[int],
    eos_token_id: Optional[Union[int, list[int]]],
    prefix_attention: Optional[str],
) -> tuple[MuToRModel, int, int, set[int]]:
    """``generate``'s arguments checked and resolved: ``(model, K, prompt_len, eos)``; ``prompt_len`` is the
    length of the bidirectional prefix (0: causal), ``eos`` the set of stop tokens (the model's by default)."""
    if isinstance(model, str):
        model = MuToRModel.from_pretrained(model)
    if not isinstance(model, MuToRModel):
        raise TypeError(f"speculative.generate needs a MuToRModel or a MuToR checkpoint directory, got {type(model).__name__}")
    if model.mutor_config.is_2d:
        raise ValueError("drafting with registers uses 1D offsets; this model was trained with 2D offsets (d_max_2d)")
    if model.attn_implementation not in ("sdpa", "eager"):
        raise ValueError(f"drafting needs sdpa or eager attention, got {model.attn_implementation!r}")
    if isinstance(draft_registers, DraftLength):
        K = draft_registers.k_max
    elif draft_registers in (None, "auto"):
        K = model.mutor_config.d_max
    elif isinstance(draft_registers, bool) or not isinstance(draft_registers, int) or draft_registers < 1:
        raise ValueError(f"draft_registers must be 'auto' or an integer >= 1 (1: plain greedy decoding), "
                         f"got {draft_registers!r}")
    else:
        K = draft_registers
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be (1, n): batch size 1, got shape {tuple(input_ids.shape)}")
    prefix = model.mutor_config.prefix_attention if prefix_attention is None else prefix_attention
    check_prefix_attention(prefix, "prefix_attention")
    prompt_len = input_ids.shape[1] if prefix == "bidirectional" else 0
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens!r}")
    if eos_token_id is None:
        gc = getattr(model.base_model, "generation_config", None)
        eos_token_id = getattr(gc, "eos_token_id", None)
    eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    return model, K, prompt_len, eos


def _draft_forward(
    model: MuToRModel, emb: torch.nn.Module, reg_vec: Optional[torch.Tensor], offsets: list[int],
    cache: DynamicCache, pending: torch.Tensor, draft: list[int], prompt_len: int, tail: bool = False,
    last: bool = False,
) -> tuple[torch.Tensor, int, int, list[int]]:
    """One forward of ``feed = [pending, draft]`` (m tokens) plus K-1 registers after each of
    ``feed[a:]``, ``a`` being the newest kept token (``tail``: after ``feed[-1]`` only; ``last``: none after
    ``feed[-1]``, whose keeping ends decoding); the cache grows by all m + R rows.
    Returns ``(logits (m-a+R, V), m, a, ends)``: the rows of feed[a:] (the prompt before its last token needs
    none), then the registers, after each index of ``feed`` in ``ends`` in turn."""
    dev = pending.device
    past = cache.get_seq_length()
    feed = torch.cat([pending, torch.tensor(draft, dtype=torch.long, device=dev)])   # (m,)
    m, a = feed.numel(), pending.numel() - 1               # a: index of the newest kept token in feed
    ends = ([m - 1] if tail else list(range(a, m))) if offsets else []    # tokens whose registers may draft
    ends = [e for e in ends if e < m - last]                                # the next round
    src = torch.tensor(ends, dtype=torch.long, device=dev).repeat_interleave(len(offsets))   # (R,)
    d = torch.tensor(offsets, dtype=torch.long, device=dev).repeat(len(ends))  # (R,)
    x = emb(feed[None])                                                        # (1, m, C)
    if src.numel():
        x = torch.cat([x, reg_vec.to(x.dtype).repeat(len(ends), 1)[None]], 1)  # (1, m+R, C)
    if m == 1 and not src.numel() and past and not any(model.windows.values()):
        # one regular token, no register, full attention: it sees every cached token, which is what the model
        # does with no mask at all (plain greedy's step; no (past x past) mask to build)
        mask, pos = None, torch.tensor([[past]], device=dev)
    else:
        mask, pos = _step_mask(model, past, m, src, past + src + d - 1, x.dtype, prompt_len)
    keep = torch.zeros(1, x.shape[1], dtype=torch.bool, device=dev)
    keep[0, a:] = True                                     # rows before a (the prompt's) need no logits
    logits = model.logits_at({"inputs_embeds": x, "attention_mask": mask, "position_ids": pos,
                              cache_argument(model.base_model): cache, "use_cache": True}, keep)  # (m-a+R, V)
    return logits, m, a, ends


def teacher_forced_drafts(model: MuToRModel, prompt: list[int], answer: list[int],
                          prefix_attention: Optional[str] = None) -> tuple[list[int], list[list[int]]]:
    """What drafting computes round by round, for a known answer in one forward: ``prompt + answer[:-1]`` with
    registers for offsets 2..d_max after the prompt's last token and after every answer token but the last.
    Returns ``(ntp, drafts)``: ``ntp[j]`` the regular greedy prediction of ``answer[j]``, ``drafts[j]`` the
    registers' greedy draft after the prompt (j = 0) or after ``answer[j-1]``, proposing ``answer[j+1], ...``."""
    ids = torch.tensor([prompt])
    _, k_max, prompt_len, _ = _checked_arguments(model, ids, 1, "auto", None, prefix_attention)
    offsets = list(range(2, k_max + 1))
    with torch.no_grad():
        logits, m, a, ends = _draft_forward(model, model.base_model.get_input_embeddings(),
                                            _register_vectors(model, offsets), offsets, DynamicCache(), ids[0],
                                            answer[:-1], prompt_len)                      # (m-a+R, V)
    ntp = logits[: m - a].argmax(-1).tolist()                                           # row j predicts answer[j]
    return ntp, logits[m - a:].argmax(-1).view(len(ends), len(offsets)).tolist()        # (len(answer), K-1)


def _verify(draft: list[int], greedy: list[int], stats: DraftStats) -> int:
    """How many draft tokens are kept: ``draft[i]`` proposes ``x_{e+2+i}`` and is kept while it equals the
    model's greedy choice ``greedy[i]`` (after ``feed[a + i]``); counts offered and accepted drafts per offset
    into ``stats``."""
    kept = 0
    for i, g in enumerate(draft):                          # verify: draft[i] proposes x_{e+2+i}... in feed order
        stats.offered[i + 2] = stats.offered.get(i + 2, 0) + 1
        if g != greedy[i]:
            break
        stats.accepted[i + 2] = stats.accepted.get(i + 2, 0) + 1
        kept += 1
    return kept


def _verify_sampled(draft: list[int], q: Optional[torch.Tensor], rows: torch.Tensor, temperature: float,
                    generator: Optional[torch.Generator], stats: DraftStats) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): ``draft[i]``, drawn from ``q[i]``, is
    kept with probability ``min(1, p_i(g) / q_i(g))``, ``p_i`` being the model's distribution after
    ``feed[a + i]`` (``rows[i]`` at ``temperature``); at the first rejection a token is drawn from the
    residual ``max(0, p_i - q_i)`` (normalised), and when every draft is kept from ``p`` after the last one.
    Each emitted token is then distributed exactly as plain sampling from the model. Returns
    ``(kept, next token)``. A register's draft for ``x_{e+d}`` sees only ``x_<=e``; that is allowed, the
    proposal need only be fixed before the test."""
    p = torch.softmax(rows.float() / temperature, -1)                                 # (len(draft)+1, V)
    for i, g in enumerate(draft):
        stats.offered[i + 2] = stats.offered.get(i + 2, 0) + 1
        u = torch.rand((), generator=generator, device=p.device)
        if u * q[i, g] < p[i, g]:                          # u < p/q without dividing by a tiny q
            stats.accepted[i + 2] = stats.accepted.get(i + 2, 0) + 1
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=generator))


def _until_end(draft: list[int], eos: set[int], room: int, sampled: bool = False) -> tuple[list[int], bool]:
    """``draft`` up to its first eos and at most ``room`` tokens, and whether it foresaw an eos. Greedy: the eos
    is cut too, since feeding it saves nothing (when the drafts before it are kept, the model's own next token
    is that eos if the draft was right). Sampled: the eos stays, since dropping a draft for its value would
    change the distribution of what is emitted in its place; only the tokens after it go, which could never
    be emitted (nor any past ``max_new_tokens``)."""
    for i, t in enumerate(draft[:max(room, 0)]):
        if t in eos:
            return draft[:i + sampled], True
    return draft[:max(room, 0)], False


def _emit(new: list[int], out_ids: list[int], stats: DraftStats, max_new_tokens: int, eos: set[int]) -> bool:
    """Append ``new`` to ``out_ids`` up to ``max_new_tokens`` and the first eos; True when decoding is done."""
    for t in new:
        if stats.new_tokens >= max_new_tokens:
            return True
        out_ids.append(t)
        stats.new_tokens += 1
        if t in eos:
            return True
    return stats.new_tokens >= max_new_tokens
