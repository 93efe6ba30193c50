"""Property-based tests of ``mutor.core.layout.build_layout`` and ``mutor.core.masks.allowed_dense``.

Every expectation is computed by a naive pure-Python reference written from the
rule in layout.py's docstring (loops over tokens, no reuse of mutor's vectorised
code): documents, eligibility, register lists, and the full (q, k) attention
matrix. Batches are random: sizes, lengths, left/right/interior padding, packed
documents whose position ids restart, prompts (labels -100), sparse supervision,
1D and 2D offsets, ``num_registers``, causal and bidirectional-prefix attention,
and sliding windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mutor import MuToRConfig
from mutor.core.layout import build_layout, offset_target_layout, regular_layout
from mutor.core.masks import allowed_dense

IGN = -100


# ----------------------------------------------------------------------------- batch strategy
@dataclass
class Batch:
    labels: list[list[int]]
    am: list[list[int]]
    pos: list[list[int]]
    pass_am: bool
    pass_pos: bool

    @property
    def B(self) -> int:
        return len(self.labels)

    @property
    def T(self) -> int:
        return len(self.labels[0])

    def tensors(self):
        labels = torch.tensor(self.labels, dtype=torch.long)
        am = torch.tensor(self.am, dtype=torch.long) if self.pass_am else None
        pos = torch.tensor(self.pos, dtype=torch.long) if self.pass_pos else None
        return labels, am, pos


@st.composite
def rows(draw, T: int):
    """One row: a random sequence of document / padding segments, cut to length T."""
    labels, am, pos = [], [], []
    first = True
    while len(labels) < T:
        # left padding is likely at the start, right padding at the end, interior padding sometimes
        kind = draw(st.sampled_from(["doc", "doc", "doc", "pad"] if not first else ["doc", "doc", "pad"]))
        first = False
        n = draw(st.integers(1, max(1, min(10, T - len(labels)))))
        if kind == "pad":
            pad_pos = draw(st.sampled_from(["zero", "one", "continue"]))
            pad_label = draw(st.sampled_from([IGN, IGN, 7]))   # a label on padding must never be used
            for i in range(n):
                am.append(0)
                labels.append(pad_label)
                if pad_pos == "zero":
                    pos.append(0)
                elif pad_pos == "one":
                    pos.append(1)
                else:
                    pos.append((pos[-1] + 1) if pos else i)
        else:
            start = draw(st.sampled_from([0, 0, 0, 1, 2, 3]))
            prompt = draw(st.integers(0, n))
            p_ign = draw(st.sampled_from([0.0, 0.0, 0.3]))
            for i in range(n):
                am.append(1)
                pos.append(start + i)
                if i < prompt:
                    labels.append(IGN)
                else:
                    ign = draw(st.floats(0, 1)) < p_ign if p_ign else False
                    labels.append(IGN if ign else draw(st.integers(0, 60)))
    return labels[:T], am[:T], pos[:T]


@st.composite
def batches(draw, max_b: int = 4, max_t: int = 24):
    B = draw(st.integers(1, max_b))
    T = draw(st.integers(1, max_t))
    rs = [draw(rows(T)) for _ in range(B)]
    labels = [r[0] for r in rs]
    am = [r[1] for r in rs]
    pos = [r[2] for r in rs]
    all_ones = all(all(v == 1 for v in row) for row in am)
    arange = all(row == list(range(T)) for row in pos)
    pass_am = (not all_ones) or draw(st.booleans())
    pass_pos = (not arange) or draw(st.booleans())
    return Batch(labels, am, pos, pass_am, pass_pos)


@st.composite
def configs(draw):
    num_registers = draw(st.sampled_from([None, None, 1, 2, 3, 5]))
    prefix = draw(st.sampled_from(["causal", "bidirectional"]))
    placement = draw(st.sampled_from(["within_answer", "within_answer", "supervised_target"]))
    if draw(st.booleans()):
        w = draw(st.integers(2, 5))
        return MuToRConfig(d_max_2d=draw(st.integers(2, w)), grid_width=w, grid_start=draw(st.integers(0, 2)),
                           num_registers=num_registers, prefix_attention=prefix, register_placement=placement)
    d_max = draw(st.integers(1, 5))
    return MuToRConfig(d_max=d_max, min_offset=draw(st.integers(1, d_max)), num_registers=num_registers,
                       prefix_attention=prefix, register_placement=placement)


# ----------------------------------------------------------------------------- naive reference
def naive_docs(am: list[int], pos: list[int]) -> list[Optional[int]]:
    """Document id of every token of one row, None for padding."""
    out, cur = [], -1
    for j in range(len(am)):
        if j == 0 or pos[j] != pos[j - 1] + 1 or am[j] != am[j - 1]:
            cur += 1
        out.append(cur if am[j] == 1 else None)
    return out


def naive_offset(config: MuToRConfig, choice_idx: int) -> tuple[int, int]:
    """(d, d_w) of one offset choice, from the paper's formula (d_w is 0 in 1D)."""
    if config.d_max_2d is None:
        return config.min_offset + choice_idx, 0
    k = config.d_max_2d
    pairs = []
    for dh in range(1, k + 1):
        for dw in range(1, k + 1):
            if not (dh == 1 and dw == 1):
                pairs.append((dh, dw))
    dh, dw = pairs[choice_idx]
    return (dh - 1) * config.grid_width + dw - 1, dw


def naive_num_choices(config: MuToRConfig) -> int:
    if config.d_max_2d is None:
        return config.d_max - config.min_offset + 1
    return config.d_max_2d ** 2 - 1


def naive_eligible(config, labels, am, pos, doc, choice_idx) -> list[int]:
    """Source indices t of every eligible register of one row, increasing."""
    T = len(labels)
    d, dw = naive_offset(config, choice_idx)
    out = []
    for t in range(T):
        tgt = t + d
        if tgt >= T:
            continue
        if labels[tgt] == IGN or am[tgt] != 1 or am[t] != 1:
            continue
        if doc[t] != doc[tgt]:
            continue
        # the paper (3.3): "we interleave register tokens only within the answer sequence" - the official
        # code puts a register before each answer token, i.e. after x_t only when x_{t+1} is in the answer
        if config.register_placement == "within_answer" and (labels[t + 1] == IGN or am[t + 1] != 1
                                                             or doc[t + 1] != doc[t]):
            continue
        if config.d_max_2d is not None:
            if pos[t] < config.grid_start:
                continue
            col = (pos[t] - config.grid_start) % config.grid_width
            if col + dw - 1 >= config.grid_width:
                continue
        out.append(t)
    return out


def naive_in_prompt(labels, doc, q: int) -> bool:
    """Bidirectional mode: q is a prompt token iff no supervised label lies in (doc start, q]."""
    if doc[q] is None:
        return False
    s = q
    while s > 0 and doc[s - 1] == doc[q]:
        s -= 1
    return all(labels[j] == IGN for j in range(s + 1, q + 1))


def naive_regular_sees(config, labels, pos, doc, q: int, k: int, window: Optional[int], qpos: int) -> bool:
    """Whether a query with the attention of regular token q (at position qpos) sees regular key k != itself."""
    if doc[q] is None or doc[k] is None or doc[k] != doc[q]:
        return False
    if window is not None and not (qpos - pos[k] < window):
        return False
    if k <= q:
        return True
    if config.prefix_attention == "bidirectional":
        return naive_in_prompt(labels, doc, q) and naive_in_prompt(labels, doc, k)
    return False


def naive_mask(config, labels, am, pos, doc, regs, R, window):
    """(L, L) list of bools for one row; regs = [(source, position id)] of the valid slots in order."""
    T = len(labels)
    L = T + R
    m = [[False] * L for _ in range(L)]
    for q in range(L):
        m[q][q] = True
        if q < T:
            if am[q] != 1:
                continue
            src, qpos = q, pos[q]
        elif q - T < len(regs):
            src, qpos = regs[q - T]
        else:
            continue
        for k in range(T):
            if k != q and naive_regular_sees(config, labels, pos, doc, src, k, window, qpos):
                m[q][k] = True
    return m


# ----------------------------------------------------------------------------- helpers
def call(batch: Batch, config: MuToRConfig, offset_index, seed: int):
    labels, am, pos = batch.tensors()
    g = torch.Generator().manual_seed(seed)
    return build_layout(labels, config, attention_mask=am, position_ids=pos, offset_index=offset_index, generator=g)


def actual_registers(lay, b: int) -> list[tuple[int, int, int, int]]:
    T = lay.num_regular
    out = []
    for i in range(lay.num_slots):
        if bool(lay.reg_valid[b, i]):
            out.append((int(lay.reg_source[b, i]), int(lay.reg_labels[b, i]),
                        int(lay.position_ids[b, T + i]), int(lay.reg_choice[b, i])))
    return out


def check_layout(batch: Batch, config: MuToRConfig, lay, choice: list[int]) -> list[list[tuple[int, int]]]:
    """Check everything but the mask; return the (source, position id) of each row's valid registers."""
    B, T = batch.B, batch.T
    assert lay.num_regular == T
    assert [int(c) for c in lay.offset_index] == choice
    # ntp labels: labels shifted left by one, -100 at the end
    for b in range(B):
        assert lay.ntp_labels[b].tolist() == batch.labels[b][1:] + [IGN]
        assert lay.position_ids[b, :T].tolist() == batch.pos[b]
    eligible_counts, regs_all = [], []
    for b in range(B):
        lab, am, pos = batch.labels[b], batch.am[b], batch.pos[b]
        doc = naive_docs(am, pos)
        d, _ = naive_offset(config, choice[b])
        elig = naive_eligible(config, lab, am, pos, doc, choice[b])
        got = actual_registers(lay, b)
        if config.num_registers is None:
            expected = [(t, lab[t + d], pos[t] + d - 1, choice[b]) for t in elig]
            assert got == expected, f"row {b}"
        else:
            assert len(got) == min(config.num_registers, len(elig)), f"row {b}"
            srcs = [g[0] for g in got]
            assert srcs == sorted(set(srcs)), f"row {b}: sources not strictly increasing"
            for t, lbl, p, c in got:
                assert t in elig, f"row {b}: source {t} not eligible"
                assert (lbl, p, c) == (lab[t + d], pos[t] + d - 1, choice[b])
        eligible_counts.append(len(got))
        regs_all.append([(g[0], g[2]) for g in got])
        # valid slots first, then empty ones that carry no label
        n = len(got)
        assert lay.reg_valid[b].tolist() == [True] * n + [False] * (lay.num_slots - n)
        assert all(int(x) == IGN for x in lay.reg_labels[b, n:])
        # documents: same partition as the naive one, padding and empty slots get -1
        ids = lay.doc_ids[b, :T].tolist()
        for i in range(T):
            assert (ids[i] == -1) == (doc[i] is None)
            for j in range(T):
                if doc[i] is not None and doc[j] is not None:
                    assert (ids[i] == ids[j]) == (doc[i] == doc[j])
        assert lay.key_ok[b].tolist() == [a == 1 for a in am] + [False] * lay.num_slots
    assert lay.num_slots == max(eligible_counts)
    return regs_all


def check_mask(batch: Batch, config: MuToRConfig, lay, regs_all, window: Optional[int]) -> None:
    T, R = batch.T, lay.num_slots
    L = T + R
    allowed = allowed_dense(lay, window)
    assert allowed.shape == (batch.B, 1, L, L) and allowed.dtype == torch.bool
    for b in range(batch.B):
        lab, am, pos = batch.labels[b], batch.am[b], batch.pos[b]
        doc = naive_docs(am, pos)
        regs = regs_all[b]
        m = allowed[b, 0].tolist()
        exp = naive_mask(config, lab, am, pos, doc, regs, R, window)
        assert m == exp, (f"row {b}: mask differs at "
                          f"{[(q, k) for q in range(L) for k in range(L) if m[q][k] != exp[q][k]][:10]}")

        # the named properties, checked directly on the library's mask
        def doc_of(i):
            if i < T:
                return doc[i]
            return doc[regs[i - T][0]] if i - T < len(regs) else None

        for q in range(L):
            assert any(m[q]), f"row {b}: query {q} sees nothing"
            for k in range(L):
                if not m[q][k] or q == k:
                    continue
                assert k < T, f"row {b}: {q} attends to register slot {k}"
                assert am[k] == 1, f"row {b}: {q} attends to padding {k}"
                assert doc_of(q) is not None and doc_of(q) == doc_of(k), f"row {b}: ({q},{k}) crosses documents"
            if q < T and am[q] == 0:
                assert [k for k in range(L) if m[q][k]] == [q], f"row {b}: padding {q} sees others"
            if q >= T + len(regs):
                assert [k for k in range(L) if m[q][k]] == [q], f"row {b}: empty slot {q} sees others"
            if q < T and am[q] == 1 and config.prefix_attention == "causal":
                want = [k for k in range(T) if k <= q and am[k] == 1 and doc[k] == doc[q]
                        and (window is None or pos[q] - pos[k] < window)]
                assert [k for k in range(L) if m[q][k]] == want, f"row {b}: causal row {q}"
        if window is None:
            # a register sees exactly what its source sees, plus itself
            for i, (t, _) in enumerate(regs):
                q = T + i
                assert [k for k in range(L) if m[q][k] and k != q] == [k for k in range(L) if m[t][k]]


# ----------------------------------------------------------------------------- properties
@settings(max_examples=350, deadline=None)
@given(data=st.data(), batch=batches(), config=configs(), seed=st.integers(0, 2**31 - 1),
       window=st.sampled_from([None, None, 1, 2, 3, 5]))
def test_layout_and_mask_match_naive_reference(data, batch, config, seed, window):
    n = naive_num_choices(config)
    assert len(config.offset_choices()) == n
    if data.draw(st.booleans(), label="explicit offset_index"):
        choice = data.draw(st.lists(st.integers(0, n - 1), min_size=batch.B, max_size=batch.B), label="offsets")
        lay = call(batch, config, torch.tensor(choice), seed)
    else:
        lay = call(batch, config, None, seed)
        choice = [int(c) for c in lay.offset_index]
        assert all(0 <= c < n for c in choice)
    regs_all = check_layout(batch, config, lay, choice)
    check_mask(batch, config, lay, regs_all, window)


@settings(max_examples=150, deadline=None)
@given(batch=batches(), prefix=st.sampled_from(["causal", "bidirectional"]), window=st.sampled_from([None, 1, 2, 5]))
def test_regular_layout_is_the_rule_without_registers(batch, prefix, window):
    """``regular_layout`` (the next-token baseline's mask, decoding's prompt mask): the naive reference's
    regular-token attention, documents and shifted labels, no register slot, nothing drawn from the RNG."""
    labels, am, pos = batch.tensors()
    before = torch.random.get_rng_state()
    lay = regular_layout(labels, prefix, am, pos)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert lay.num_slots == 0 and lay.num_registers == 0 and lay.num_regular == batch.T
    for b in range(batch.B):
        assert lay.ntp_labels[b].tolist() == batch.labels[b][1:] + [IGN]
        assert lay.position_ids[b].tolist() == batch.pos[b]
        assert lay.key_ok[b].tolist() == [a == 1 for a in batch.am[b]]
    check_mask(batch, MuToRConfig(prefix_attention=prefix), lay, [[] for _ in range(batch.B)], window)


@settings(max_examples=120, deadline=None)
@given(batch=batches(), d=st.integers(1, 5), window=st.sampled_from([None, 2]))
def test_offset_target_layout_is_every_supervised_target_at_d(batch, d, window):
    """``offset_target_layout`` (the Multi-Token baseline's head-d targets): the naive reference's registers for
    the single offset d under the placement "supervised_target" (prompt positions included), causal attention,
    and nothing drawn from the RNG."""
    labels, am, pos = batch.tensors()
    before = torch.random.get_rng_state()
    lay = offset_target_layout(labels, d, am, pos)
    assert torch.equal(torch.random.get_rng_state(), before)
    config = MuToRConfig(d_max=d, min_offset=d, register_placement="supervised_target")
    regs_all = check_layout(batch, config, lay, [0] * batch.B)
    check_mask(batch, config, lay, regs_all, window)


@settings(max_examples=120, deadline=None)
@given(batch=batches(max_t=32), d_max=st.integers(1, 4), n=st.integers(1, 4))
def test_num_registers_picks_among_eligible(batch, d_max, n):
    """With n registers the count is min(n, #eligible), sources are distinct and eligible, for each seed."""
    config = MuToRConfig(d_max=d_max, min_offset=1, num_registers=n)
    choice = [d_max - 1] * batch.B
    for seed in range(3):
        lay = call(batch, config, torch.tensor(choice), seed)
        check_layout(batch, config, lay, choice)


@settings(max_examples=60, deadline=None)
@given(batch=batches(), config=configs(), seed=st.integers(0, 2**31 - 1))
def test_same_generator_seed_same_layout(batch, config, seed):
    a = call(batch, config, None, seed)
    b = call(batch, config, None, seed)
    for name in ("position_ids", "doc_ids", "limit", "key_ok", "ntp_labels", "reg_source", "reg_labels",
                 "reg_choice", "reg_valid", "offset_index"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_num_registers_sampling_varies_with_seed():
    """Sanity: sampling really is random (otherwise the n-register properties above are weak)."""
    labels = torch.arange(40).unsqueeze(0)
    config = MuToRConfig(d_max=1, num_registers=3)
    seen = {tuple(call(Batch(labels.tolist(), [[1] * 40], [list(range(40))], False, False), config,
                       torch.tensor([0]), s).reg_source[0].tolist()) for s in range(10)}
    assert len(seen) > 1


# ----------------------------------------------------------------------------- the paper's placement rule
def test_registers_sit_only_within_the_answer():
    """Paper 3.3 on one prompt/answer row: [p0..p4 | a0..a6], d=3. The official code builds
    [p0..p4, r, a0, r, a1, ...]: the registers follow p4, a0, ..., a3 (each one before an answer token
    whose successor-at-d is still in the answer). ``supervised_target`` also places them after p2 and p3."""
    labels = torch.tensor([[IGN] * 5 + list(range(10, 17))])
    lay = build_layout(labels, MuToRConfig(d_max=3, min_offset=3), offset_index=torch.tensor([0]))
    assert lay.reg_source[0].tolist() == [4, 5, 6, 7, 8]                    # p4, a0..a3
    assert lay.reg_labels[0].tolist() == [12, 13, 14, 15, 16]               # a2..a6
    old = build_layout(labels, MuToRConfig(d_max=3, min_offset=3, register_placement="supervised_target"),
                       offset_index=torch.tensor([0]))
    assert old.reg_source[0].tolist() == [2, 3, 4, 5, 6, 7, 8]              # d-1 = 2 more, in the prompt


def test_star_graph_registers_are_not_in_the_prompt():
    """G(2,3)-like row: prompt (graph, start, goal, '=') then a 3-node path + eos as the answer."""
    prompt, path = [7, 8, 9, 8, 10, 7, 11, 7, 10, 3], [7, 9, 10, 2]
    labels = torch.tensor([[IGN] * len(prompt) + path])
    for d in (2, 3):
        lay = build_layout(labels, MuToRConfig(d_max=3, min_offset=2), offset_index=torch.tensor([d - 2]))
        src = lay.reg_source[0][lay.reg_valid[0]].tolist()
        assert min(src) == len(prompt) - 1 and all(labels[0, t + 1] != IGN for t in src)
        assert len(src) == len(path) - d + 1


@settings(max_examples=80, deadline=None)
@given(batch=batches(), d_max=st.integers(1, 5), n=st.sampled_from([None, 2]), prefix=st.sampled_from(
    ["causal", "bidirectional"]), seed=st.integers(0, 2**31 - 1), two_d=st.booleans())
def test_placement_rules_coincide_when_every_token_is_supervised(batch, d_max, n, prefix, seed, two_d):
    """Pretraining data (every real token supervised, packed or padded): both rules place the same registers."""
    sup = Batch([[tok if a else IGN for tok, a in zip(range(100, 100 + len(r)), am)]
                 for r, am in zip(batch.labels, batch.am)], batch.am, batch.pos, batch.pass_am, batch.pass_pos)
    kw = dict(d_max_2d=2, grid_width=3, grid_start=1) if two_d else dict(d_max=d_max)
    lays = [call(sup, MuToRConfig(**kw, num_registers=n, prefix_attention=prefix, register_placement=p), None, seed)
            for p in ("within_answer", "supervised_target")]
    for name in ("position_ids", "limit", "reg_source", "reg_labels", "reg_valid", "offset_index"):
        assert torch.equal(getattr(lays[0], name), getattr(lays[1], name)), name
