"""MuToRConfig: validation, offsets, embeddings count, (de)serialisation, HfArgumentParser."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import transformers

from mutor import MuToRConfig

FIELDS = [f.name for f in dataclasses.fields(MuToRConfig)]


def first_field_named(msg: str) -> str | None:
    """The dataclass field whose name occurs earliest (as a whole word) in msg."""
    hits = [(m.start(), name) for name in FIELDS if (m := re.search(rf"\b{re.escape(name)}\b", msg))]
    return min(hits)[1] if hits else None


INVALID = [
    # (kwargs, field the error must name)
    (dict(d_max=0), "d_max"),
    (dict(d_max=-3), "d_max"),
    (dict(d_max=2.0), "d_max"),
    (dict(d_max="4"), "d_max"),
    (dict(d_max=True), "d_max"),
    (dict(d_max=None), "d_max"),
    (dict(min_offset=0), "min_offset"),
    (dict(min_offset=-1), "min_offset"),
    (dict(min_offset=1.0), "min_offset"),
    (dict(min_offset=5, d_max=4), "min_offset"),
    (dict(min_offset=2, d_max=1), "min_offset"),
    (dict(loss_weight=-0.1), "loss_weight"),
    (dict(loss_weight=1.0), "loss_weight"),
    (dict(loss_weight=1), "loss_weight"),
    (dict(loss_weight=1.5), "loss_weight"),
    (dict(loss_weight=True), "loss_weight"),
    (dict(loss_weight=False), "loss_weight"),
    (dict(loss_weight=float("nan")), "loss_weight"),
    (dict(loss_weight="0.3"), "loss_weight"),
    (dict(num_registers=0), "num_registers"),
    (dict(num_registers=-2), "num_registers"),
    (dict(num_registers=2.0), "num_registers"),
    (dict(num_registers=True), "num_registers"),
    (dict(register_embedding="per-offset"), "register_embedding"),
    (dict(register_embedding="Shared"), "register_embedding"),
    (dict(register_embedding=""), "register_embedding"),
    (dict(prefix_attention="prefix"), "prefix_attention"),
    (dict(prefix_attention="Causal"), "prefix_attention"),
    (dict(prefix_attention=None), "prefix_attention"),
    (dict(seed=1.5), "seed"),
    (dict(seed="0"), "seed"),
    (dict(grid_start=-1), "grid_start"),
    (dict(grid_start=0.0), "grid_start"),
    (dict(d_max_2d=2), "grid_width"),                       # d_max_2d without grid_width
    (dict(d_max_2d=3, grid_width=None), "grid_width"),
    (dict(d_max_2d=2, grid_width=0), "grid_width"),
    (dict(d_max_2d=2, grid_width=4.0), "grid_width"),
    (dict(grid_width=4), "grid_width"),                     # grid_width without d_max_2d
    (dict(d_max_2d=1, grid_width=4), "d_max_2d"),
    (dict(d_max_2d=0, grid_width=4), "d_max_2d"),
    (dict(d_max_2d=2.0, grid_width=4), "d_max_2d"),
    (dict(d_max_2d=5, grid_width=4), "d_max_2d"),           # d_max_2d > grid_width
    (dict(d_max_2d=3, grid_width=2), "d_max_2d"),
]


@pytest.mark.parametrize("kwargs,field", INVALID, ids=[f"{f}:{k}" for k, f in INVALID])
def test_invalid_value_raises_naming_field(kwargs, field):
    with pytest.raises(ValueError) as err:
        MuToRConfig(**kwargs)
    msg = str(err.value)
    assert re.search(rf"\b{re.escape(field)}\b", msg), msg
    assert first_field_named(msg) == field, msg


VALID = [
    dict(),
    dict(d_max=1),
    dict(d_max=6, min_offset=6),
    dict(d_max=4, min_offset=2),
    dict(loss_weight=0),
    dict(loss_weight=0.0),
    dict(loss_weight=0.999),
    dict(num_registers=1),
    dict(num_registers=None),
    dict(register_embedding="per_offset"),
    dict(prefix_attention="bidirectional"),
    dict(seed=0),
    dict(d_max_2d=2, grid_width=2),
    dict(d_max_2d=3, grid_width=16, grid_start=1),
]


@pytest.mark.parametrize("kwargs", VALID, ids=[repr(k) for k in VALID])
def test_valid_values_construct(kwargs):
    cfg = MuToRConfig(**kwargs)
    for k, v in kwargs.items():
        assert getattr(cfg, k) == v


def test_defaults():
    cfg = MuToRConfig()
    assert (cfg.d_max, cfg.min_offset, cfg.loss_weight, cfg.num_registers) == (4, 1, 0.3, None)
    assert (cfg.register_embedding, cfg.prefix_attention) == ("shared", "causal")
    assert (cfg.d_max_2d, cfg.grid_width, cfg.grid_start, cfg.seed) == (None, None, 0, None)
    assert not cfg.is_2d


# ----------------------------------------------------------------------------- offsets
@pytest.mark.parametrize("d_max,min_offset,expected", [
    (1, 1, [(1,)]),
    (4, 1, [(1,), (2,), (3,), (4,)]),
    (4, 2, [(2,), (3,), (4,)]),
    (5, 5, [(5,)]),
])
def test_offset_choices_1d(d_max, min_offset, expected):
    cfg = MuToRConfig(d_max=d_max, min_offset=min_offset)
    assert cfg.offset_choices() == expected
    assert [cfg.raster_offset(c) for c in cfg.offset_choices()] == [c[0] for c in expected]
    assert cfg.offset_names() == [f"d={c[0]}" for c in expected]


def test_offset_choices_2d_excludes_origin():
    cfg = MuToRConfig(d_max_2d=2, grid_width=5)
    assert cfg.is_2d
    assert cfg.offset_choices() == [(1, 2), (2, 1), (2, 2)]
    assert cfg.offset_names() == ["dh=1,dw=2", "dh=2,dw=1", "dh=2,dw=2"]
    cfg3 = MuToRConfig(d_max_2d=3, grid_width=3)
    choices = cfg3.offset_choices()
    assert (1, 1) not in choices
    assert len(choices) == 8 and len(set(choices)) == 8
    assert set(choices) == {(h, w) for h in (1, 2, 3) for w in (1, 2, 3)} - {(1, 1)}


@pytest.mark.parametrize("d_max_2d,grid_width,choice,d", [
    # d = (dh-1)*w + dw - 1, by hand
    (2, 5, (1, 2), 1),     # one to the right
    (2, 5, (2, 1), 5),     # one row down: w tokens later
    (2, 5, (2, 2), 6),     # down-right
    (3, 4, (3, 1), 8),
    (3, 4, (1, 3), 2),
    (3, 4, (3, 3), 10),
    (2, 2, (2, 2), 3),
    (4, 16, (4, 4), 51),
])
def test_raster_offset_2d(d_max_2d, grid_width, choice, d):
    cfg = MuToRConfig(d_max_2d=d_max_2d, grid_width=grid_width)
    assert choice in cfg.offset_choices()
    assert cfg.raster_offset(choice) == d


def test_2d_refuses_1d_offsets():
    """2D mode samples (d_h, d_w); d_max / min_offset would be silently ignored there, so they are refused."""
    cfg = MuToRConfig(d_max_2d=2, grid_width=3)
    assert cfg.offset_choices() == [(1, 2), (2, 1), (2, 2)]
    assert [cfg.raster_offset(c) for c in cfg.offset_choices()] == [1, 3, 4]
    with pytest.raises(ValueError, match="d_max: is a 1D knob"):
        MuToRConfig(d_max=7, d_max_2d=2, grid_width=3)
    with pytest.raises(ValueError, match="min_offset: is a 1D knob"):
        MuToRConfig(min_offset=3, d_max=4, d_max_2d=2, grid_width=3)


@pytest.mark.parametrize("kwargs,shared_n,per_offset_n", [
    (dict(d_max=4), 1, 4),
    (dict(d_max=4, min_offset=2), 1, 3),
    (dict(d_max=1), 1, 1),
    (dict(d_max_2d=2, grid_width=4), 1, 3),
    (dict(d_max_2d=3, grid_width=4), 1, 8),
])
def test_num_register_embeddings(kwargs, shared_n, per_offset_n):
    assert MuToRConfig(register_embedding="shared", **kwargs).num_register_embeddings == shared_n
    assert MuToRConfig(register_embedding="per_offset", **kwargs).num_register_embeddings == per_offset_n


# ----------------------------------------------------------------------------- serialisation
@pytest.mark.parametrize("kwargs", VALID, ids=[repr(k) for k in VALID])
def test_dict_round_trip(kwargs):
    cfg = MuToRConfig(**kwargs)
    d = cfg.to_dict()
    assert set(d) == set(FIELDS)
    assert MuToRConfig.from_dict(d) == cfg
    # through JSON too (the sidecar file format)
    assert MuToRConfig.from_dict(json.loads(cfg.to_json_string())) == cfg


def test_from_dict_partial_uses_defaults():
    assert MuToRConfig.from_dict({"d_max": 2}) == MuToRConfig(d_max=2)


def test_from_dict_unknown_key_raises_naming_it():
    data = MuToRConfig().to_dict()
    data["num_regsters"] = 3
    with pytest.raises(ValueError, match=r"num_regsters"):
        MuToRConfig.from_dict(data)


def test_from_dict_validates():
    with pytest.raises(ValueError, match=r"\bd_max\b"):
        MuToRConfig.from_dict({"d_max": 0})


def test_every_field_has_help():
    fields = dataclasses.fields(MuToRConfig)
    assert len(fields) >= 10
    for f in fields:
        help_ = f.metadata.get("help")
        assert isinstance(help_, str) and help_.strip(), f.name


def test_hf_argument_parser():
    parser = transformers.HfArgumentParser(MuToRConfig)
    (cfg,) = parser.parse_args_into_dataclasses(["--d_max", "6", "--loss_weight", "0.1"])
    assert isinstance(cfg, MuToRConfig)
    assert cfg.d_max == 6 and isinstance(cfg.d_max, int)
    assert cfg.loss_weight == pytest.approx(0.1)
    assert cfg == MuToRConfig(d_max=6, loss_weight=0.1)


def test_hf_argument_parser_optional_and_2d():
    parser = transformers.HfArgumentParser(MuToRConfig)
    (cfg,) = parser.parse_args_into_dataclasses(
        ["--num_registers", "3", "--d_max_2d", "2", "--grid_width", "8", "--prefix_attention", "bidirectional"])
    assert cfg == MuToRConfig(num_registers=3, d_max_2d=2, grid_width=8, prefix_attention="bidirectional")
