"""Registers as drafters inside transformers' own ``generate``, and ``mutor.generate``, over one loop.

``RegisterDrafter`` holds a MuToR run's registers (its sidecar: config and vectors, no model) and the policy
that chooses each round's draft. Passed as ``custom_generate`` to a vanilla model's ``generate``, it receives
what transformers prepared (the prompt, the logits processors and warpers, the stopping criteria, the generation
config, the streamer) and runs :func:`mutor.generation.loop.decode` on that model, wrapped with its registers.
``mutor.generate`` is the same loop on a :class:`~mutor.MuToRModel`, returning the drafting counts with the
tokens.

The registers must belong to the model: the run's base config (architecture, hidden size, vocabulary, layers)
is checked against the model's at each call. The prompt is attended as the run was trained (its sidecar's
``prefix_attention``): a run trained with a bidirectional prompt decodes with it, as ``mutor eval`` decodes it,
where transformers' plain ``generate`` would attend to the prompt causally. Decoding is exact, so the model's
tokens (float32: greedy token for token, sampling in distribution) are those of its own decoding with that
prompt attention; the registers only decide how many tokens a forward yields.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
import weakref
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from ..core.config import check_prefix_attention
from ..methods.mutor import SIDECAR_CONFIG, SIDECAR_WEIGHTS, MuToRConfig, MuToRModel
from .forward import ModelForward
from .loop import Selector, decode
from .policy import DraftPolicy, DraftSettings, FixedDraft
from .proposer import RegisterProposer
from .stats import DraftStats

SIGNATURE = ("model_type", "hidden_size", "vocab_size", "num_hidden_layers")
MODEL_KWARGS = {"attention_mask", "position_ids", "cache", "past_key_values", "use_cache", "logits_to_keep",
                "cache_position"}        # what generate prepares for a causal LM; the drafter makes its own
DraftRegisters = Union[str, int, DraftPolicy, FixedDraft]   # "auto", a fixed K, or a policy to keep using


def make_policy(draft_registers: DraftRegisters, k_max: int, settings: Optional[DraftSettings] = None):
    """The draft policy ``draft_registers`` names: ``"auto"`` / None: a :class:`DraftPolicy` up to ``k_max``; an
    integer K: a :class:`FixedDraft`; a policy instance (anything with the policy's ``plan``): itself (what it
    learned carries over).

    Raises:
        ValueError: Anything else.
    """
    if draft_registers is None or draft_registers == "auto":
        return DraftPolicy(k_max, settings)
    if callable(getattr(draft_registers, "plan", None)):
        return draft_registers
    if isinstance(draft_registers, bool) or not isinstance(draft_registers, int) or draft_registers < 1:
        raise ValueError(f"draft_registers must be 'auto', an integer >= 1 (1: plain decoding) or a draft policy, "
                         f"got {draft_registers!r}")
    return FixedDraft(draft_registers, settings)


def _signature(config) -> dict:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return {k: getattr(text, k, None) for k in SIGNATURE}


def _saved_signature(path: Path) -> Optional[dict]:
    """The base config's signature of a run directory (a LoRA adapter: of its recorded base), None when it cannot
    be read here."""
    from transformers import AutoConfig

    from ..utils.io import lora_base_dir

    source = path
    if not (path / "config.json").is_file() and (path / "adapter_config.json").is_file():
        source = lora_base_dir(path)                       # a random-init base: the run's base/, from anywhere
    try:
        return _signature(AutoConfig.from_pretrained(str(source), local_files_only=True))
    except Exception:                                      # noqa: BLE001 - an unreadable base: checked by width
        return None


def _checked_model(model: MuToRModel) -> MuToRModel:
    if model.mutor_config.is_2d:
        raise ValueError("drafting with registers uses 1D offsets; this model was trained with 2D offsets (d_max_2d)")
    if model.attn_implementation not in ("sdpa", "eager"):
        raise ValueError(f"drafting needs sdpa or eager attention, got {model.attn_implementation!r}")
    return model


def draft_decode(model: MuToRModel, prompt: list[int], max_new_tokens: int, eos: set[int], selector: Selector,
                 policy, prompt_len: int = 0, stop=None, on_token=None) -> tuple[list[int], DraftStats]:
    """One prompt decoded by :func:`~mutor.generation.loop.decode` on ``model`` with ``policy``; the forwards
    timed by the policy's clock."""
    target = ModelForward(model, policy.k_max - 1, prompt_len)
    return decode(target, RegisterProposer(policy, selector.sample), selector, prompt, max_new_tokens, eos, stop,
                  forward_clock(policy.settings.clock), on_token)


def forward_clock(name: str) -> Callable[[], float]:
    """The clock a draft policy's forwards are timed by: ``"wall"`` is ``time.perf_counter`` (what the user waits
    for), ``"cpu"`` is ``time.thread_time``. The one place drafting reads a clock, so that tests can put a clock
    driven by a cost model in its place."""
    return time.thread_time if name == "cpu" else time.perf_counter


def _callers_streamer():
    """The streamer given to the ``generate`` that called the drafter: transformers (5.x) puts the prompt into it
    but hands a callable ``custom_generate`` only the arguments its signature adds to ``_sample``'s, not the
    streamer; read from that call's frame, None when the caller is not ``generate``."""
    import sys

    frame = sys._getframe(2)                               # the drafter's __call__ is called by generate
    return frame.f_locals.get("streamer") if frame.f_code.co_name == "generate" else None


class RegisterDrafter:
    """A MuToR run's registers as the drafters of a model's own ``generate``: lossless self-speculative decoding.

    ::

        drafter = mutor.RegisterDrafter.from_pretrained("runs/my-data/mutor")
        model = AutoModelForCausalLM.from_pretrained("runs/my-data/mutor")
        out = model.generate(**inputs, max_new_tokens=64, custom_generate=drafter)

    ``generate`` prepares everything as usual and hands the decoding loop to the drafter: greedy output equals
    ``generate``'s token for token (float32; a run trained with a bidirectional prompt: the model's greedy decoding
    with that prompt, as ``mutor eval`` decodes it, which plain ``generate`` cannot do), ``do_sample=True`` is
    speculative sampling (exact in distribution),
    with the logits processors and warpers (temperature, top-k, top-p, ...) applied as ``generate`` applies them;
    eos, stopping criteria, the streamer and ``return_dict_in_generate`` (``sequences``, ``scores``, ``logits``)
    work as there. One sequence at a time. One drafter can serve many calls: its policy's learned costs and
    acceptance carry over; ``last_stats`` holds the counts of the latest call.

    Build it with :meth:`from_pretrained`.

    Args:
        mutor_config: The run's MuToR config.
        weights: ``(n, C)`` the register vectors (``register_embeddings.weight``).
        signature: The base config's ``model_type``, ``hidden_size``, ``vocab_size``, ``num_hidden_layers`` (None:
            unknown; only the hidden size is checked).
        source: What the registers came from, for messages.
        draft_registers: ``"auto"`` (a :class:`~mutor.generation.policy.DraftPolicy` up to ``d_max``), an integer
            K (K-1 registers after the prompt and after every fed token, and the whole of their draft fed, up to
            its end: see :func:`generate`), or a policy instance.
        settings: The policy's settings (``"auto"``).
        prefix_attention: How the prompt attends to itself: ``"bidirectional"`` (the whole prompt both ways) or
            ``"causal"``. None (the default): as the run was trained (``mutor_config.prefix_attention``, which its
            sidecar records); a value that differs from it is used, with a warning.
        model: The :class:`~mutor.MuToRModel` the registers are part of, if any (used as is for its own base).

    Attributes:
        prefix_attention: The prompt attention decoding uses.
        last_stats: The :class:`~mutor.generation.stats.DraftStats` of the latest call (None before one).
    """

    def __init__(self, mutor_config: MuToRConfig, weights: torch.Tensor, signature: Optional[dict], source: str,
                 draft_registers: DraftRegisters = "auto", settings: Optional[DraftSettings] = None,
                 prefix_attention: Optional[str] = None, model: Optional[MuToRModel] = None):
        if mutor_config.is_2d:
            raise ValueError(f"{source}: drafting with registers uses 1D offsets; this run was trained with 2D "
                             "offsets (d_max_2d)")
        self.mutor_config, self.weights, self.signature, self.source = mutor_config, weights.detach(), signature, source
        self.policy = make_policy(draft_registers, mutor_config.d_max, settings)
        trained = mutor_config.prefix_attention
        if prefix_attention is None:
            prefix_attention = trained
        elif check_prefix_attention(prefix_attention, "prefix_attention") != trained:
            warnings.warn(f"RegisterDrafter: {source} was trained with prefix_attention={trained!r}; decoding with "
                          f"prefix_attention={prefix_attention!r} attends to the prompt otherwise than training did "
                          "(leave prefix_attention unset to decode as the run was trained)", UserWarning,
                          stacklevel=3)
        self.prefix_attention = check_prefix_attention(prefix_attention, "prefix_attention")
        self.last_stats: Optional[DraftStats] = None
        self._own = model
        self._wrapped: Optional[tuple[weakref.ref, MuToRModel]] = None

    @classmethod
    def from_pretrained(cls, run_or_model: Union[str, os.PathLike, MuToRModel],
                        draft_registers: DraftRegisters = "auto",
                        settings: Optional[DraftSettings] = None,
                        prefix_attention: Optional[str] = None) -> "RegisterDrafter":
        """The registers of a MuToR checkpoint directory (its sidecar only: no model is loaded) or of a
        :class:`~mutor.MuToRModel`.

        Args:
            run_or_model: A directory written by ``MuToRModel.save_pretrained`` (a run's final model or a
                ``checkpoint-*``; a LoRA run's adapter directory too), or the model.
            draft_registers: ``"auto"``, an integer K or a policy (see the class).
            settings: The policy's settings.
            prefix_attention: None (the default): the run's own, read from its sidecar (``mutor_config.json``);
                ``"causal"`` or ``"bidirectional"`` to decode otherwise (with a warning where it differs).

        Returns:
            The drafter.

        Raises:
            ValueError: The directory has no MuToR sidecar, or the run was trained with 2D offsets.
            TypeError: ``run_or_model`` is neither a directory nor a MuToRModel.
        """
        if isinstance(run_or_model, MuToRModel):
            m = run_or_model
            return cls(m.mutor_config, m.register_embeddings.weight, _signature(m.config), type(m).__name__,
                       draft_registers, settings, prefix_attention, model=m)
        if not isinstance(run_or_model, (str, os.PathLike)):
            raise TypeError(f"RegisterDrafter.from_pretrained needs a MuToR checkpoint directory or a MuToRModel, "
                            f"got {type(run_or_model).__name__}")
        path = Path(run_or_model)
        for name in (SIDECAR_CONFIG, SIDECAR_WEIGHTS):
            if not (path / name).is_file():
                raise ValueError(f"{path} has no {name}: not a MuToR checkpoint (the registers are in its sidecar, "
                                 f"{SIDECAR_CONFIG} and {SIDECAR_WEIGHTS}, which MuToRModel.save_pretrained writes)")
        from safetensors.torch import load_file

        config = MuToRConfig.from_dict({**MuToRConfig.sidecar_defaults,
                                        **json.loads((path / SIDECAR_CONFIG).read_text())})
        weights = load_file(str(path / SIDECAR_WEIGHTS))["register_embeddings.weight"]
        return cls(config, weights, _saved_signature(path), str(path), draft_registers, settings, prefix_attention)

    # ------------------------------------------------------------------ the model
    def registered(self, model) -> MuToRModel:
        """``model`` (a transformers causal LM) with these registers: a :class:`~mutor.MuToRModel` around it,
        made once per model.

        Raises:
            ValueError: The registers do not belong to ``model`` (another architecture, hidden size, vocabulary
                or depth), or its attention is neither sdpa nor eager.
        """
        if self._own is not None and self._own.base_model is model:
            return _checked_model(self._own)
        if self._wrapped is not None and self._wrapped[0]() is model:
            return self._wrapped[1]
        mine = self.signature or {"hidden_size": self.weights.shape[1]}
        theirs = _signature(model.config)
        wrong = {k: (v, theirs.get(k)) for k, v in mine.items() if v is not None and theirs.get(k) != v}
        if wrong or theirs.get("hidden_size") != self.weights.shape[1]:
            said = ", ".join(f"{k} {a!r} vs {b!r}" for k, (a, b) in wrong.items()) or \
                f"hidden_size {self.weights.shape[1]} vs {theirs.get('hidden_size')!r}"
            raise ValueError(f"the registers of {self.source} do not belong to this model ({said}: the run's base "
                             "vs this model); load the model from the same run")
        # a seed of its own: wrapping draws the (overwritten) initial vectors from it, not from torch's global RNG
        wrapped = MuToRModel(model, dataclasses.replace(self.mutor_config, seed=0))
        with torch.no_grad():
            wrapped.register_embeddings.weight.copy_(self.weights)
        self._wrapped = (weakref.ref(model), wrapped)
        return _checked_model(wrapped)

    # ------------------------------------------------------------ custom_generate
    def __call__(self, model, input_ids: torch.LongTensor, logits_processor, stopping_criteria, generation_config,
                 synced_gpus: bool = False, streamer=None, **model_kwargs):
        """The decoding loop ``generate(..., custom_generate=drafter)`` hands over (the signature of
        transformers' ``_sample``): refuses in one line what it does not do, then decodes.

        Returns:
            The prompt and the generated tokens ``(1, n + new)``, or a ``GenerateDecoderOnlyOutput`` with
            ``return_dict_in_generate``.

        Raises:
            ValueError: Batch size > 1, padding in the prompt, beam search, ``synced_gpus``, a cache passed in,
                attentions or hidden states asked for, model arguments it does not take, or registers that do not
                belong to ``model``.
        """
        gc = generation_config
        streamer = streamer if streamer is not None else _callers_streamer()
        refusals = [
            (gc.num_beams != 1, f"decodes without beams, got num_beams={gc.num_beams}"),
            (input_ids.shape[0] != 1, f"decodes one sequence at a time (batch size 1), got batch size "
                                      f"{input_ids.shape[0]}: call generate once per prompt"),
            (bool(synced_gpus), "does not decode with synced_gpus"),
            (gc.return_dict_in_generate and (gc.output_attentions or gc.output_hidden_states or gc.output_logits),
             "returns sequences and scores only (not output_attentions, output_hidden_states or output_logits)"),
            (getattr(model_kwargs.get("cache", model_kwargs.get("past_key_values")), "_is_user_defined", False),
             "makes its own cache (a cache was passed in)"),
            (model_kwargs.get("attention_mask") is not None and not bool(model_kwargs["attention_mask"].all()),
             "takes a prompt without padding (its attention_mask has zeros)"),
            (bool(set(model_kwargs) - MODEL_KWARGS), f"does not take {sorted(set(model_kwargs) - MODEL_KWARGS)}"),
        ]
        for refused, why in refusals:
            if refused:
                raise ValueError(f"RegisterDrafter {why}")
        wrapped = self.registered(model)
        prompt = input_ids[0].tolist()
        eos = set() if gc._eos_token_tensor is None else set(gc._eos_token_tensor.flatten().tolist())
        processor = logits_processor if len(logits_processor) else None
        selector = Selector(bool(gc.do_sample), processor)
        scores = []

        def on_token(t: int, s: torch.Tensor) -> None:
            if gc.return_dict_in_generate and gc.output_scores:
                scores.append(s[None])
            if streamer is not None:
                streamer.put(torch.tensor([t]))

        def stop(out: list[int], s: torch.Tensor) -> bool:
            return bool(stopping_criteria(torch.tensor([out], device=input_ids.device), s[None])[0])

        prompt_len = len(prompt) if self.prefix_attention == "bidirectional" else 0
        with torch.no_grad():
            out, self.last_stats = draft_decode(wrapped, prompt, gc.max_length - len(prompt), eos, selector,
                                                self.policy, prompt_len, stop, on_token)
        if streamer is not None:
            streamer.end()
        sequences = torch.tensor([out], dtype=input_ids.dtype, device=input_ids.device)
        if not gc.return_dict_in_generate:
            return sequences
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences, scores=tuple(scores) if gc.output_scores else None)


@torch.no_grad()
def generate(
    model: Union[MuToRModel, str, os.PathLike],
    input_ids: torch.Tensor,
    max_new_tokens: int = 64,
    draft_registers: Optional[DraftRegisters] = None,
    eos_token_id: Optional[Union[int, list[int]]] = None,
    prefix_attention: Optional[str] = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, DraftStats]:
    """Decode one prompt of a :class:`~mutor.MuToRModel` with its registers as drafters, and count the drafting.

    The output is token for token the model's own greedy decoding (``do_sample=False``), or distributed exactly
    as its own sampling at ``temperature`` (``do_sample=True``); the registers decide only how many tokens a
    forward yields. The same loop as :class:`RegisterDrafter` (``custom_generate``), without transformers'
    ``generate`` around it.

    Args:
        model: A MuToRModel trained with 1D offsets, or the directory of a MuToR checkpoint (the vanilla model plus
            its sidecar). Its attention must be ``sdpa`` or ``eager``.
        input_ids: The prompt, shape (1, n): batch size 1.
        max_new_tokens: The most tokens to generate (>= 1).
        draft_registers: ``"auto"`` or None (the default): each round's draft chosen for the most tokens per second
            (:class:`~mutor.generation.policy.DraftPolicy`), plain decoding where no draft pays. A policy instance
            does the same and keeps what it learned across calls: pass one for every prompt of an evaluation. An
            integer K: K-1 registers (offsets 2..K) after the prompt and after every fed token, and the whole of
            their draft after the newest kept token fed in the next round (K = 1 is plain decoding). A draft ends
            where feeding more could not save a forward: before its first eos (greedy; a sampled draft keeps its
            eos) and at ``max_new_tokens``; no register follows a token whose keeping ends decoding. So the
            prompt's own round feeds no draft, and greedy decoding offers none at all to an answer of one token
            and its eos, or with ``max_new_tokens`` 2 or less.
        eos_token_id: Stop after this token (or any of a list); default: the model's generation config.
        prefix_attention: ``"bidirectional"`` lets the prompt see itself both ways, as the evaluation harness
            decodes a bidirectional-prefix run; ``"causal"``; None (the default): as the model was trained
            (``model.mutor_config.prefix_attention``, which a checkpoint's sidecar records).
        do_sample: Speculative sampling from the model's distribution at ``temperature`` (no top-k / top-p: use
            ``generate(..., custom_generate=RegisterDrafter...)`` for those).
        temperature: Sampling temperature (> 0); used only with ``do_sample``.
        generator: Random numbers for sampling.

    Returns:
        ``(ids, stats)``: ``ids`` (1, n + new) is the prompt followed by the generated tokens (up to and including
        the first eos); ``stats`` the :class:`~mutor.generation.stats.DraftStats` of the run.

    Raises:
        TypeError: ``model`` is neither a ``MuToRModel`` nor a directory.
        ValueError: An argument out of range, a batch larger than 1, a model trained with 2D offsets, an attention
            backend other than sdpa / eager, or per-offset registers not trained for an offset drafted.
    """
    if isinstance(model, (str, os.PathLike)):
        model = MuToRModel.from_pretrained(model)
    if not isinstance(model, MuToRModel):
        raise TypeError(f"mutor.generate needs a MuToRModel or a MuToR checkpoint directory, got "
                        f"{type(model).__name__}")
    _checked_model(model)
    policy = make_policy(draft_registers, model.mutor_config.d_max)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be (1, n): batch size 1, got shape {tuple(input_ids.shape)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if do_sample and (isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0):
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature!r}")
    prefix = model.mutor_config.prefix_attention if prefix_attention is None else prefix_attention
    check_prefix_attention(prefix, "prefix_attention")
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model.base_model, "generation_config", None), "eos_token_id", None)
    eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    selector = Selector(do_sample, (lambda ids, s: s / temperature) if do_sample and temperature != 1 else None,
                        generator)
    base = model.base_model
    was_training = base.training                   # switched only when needed: eval() walks every module
    if was_training:
        base.eval()
    try:
        out, stats = draft_decode(model, input_ids[0].tolist(), max_new_tokens, eos, selector, policy,
                                  input_ids.shape[1] if prefix == "bidirectional" else 0)
    finally:
        if was_training:
            base.train()
    return torch.tensor([out], device=model.device), stats
