"""Every mask function in flashcheck.contract.masks against its definition written out with plain loops."""

from __future__ import annotations

import itertools

import pytest
import torch

from flashcheck.contract import masks
from flashcheck.errors import InvalidArgument

# (B, H, Nq, Nk): square, Nq > Nk (rows with no visible key under bottom-right), Nq < Nk, and length 1.
SHAPES = [(2, 3, 5, 5), (1, 2, 7, 4), (2, 1, 4, 9), (1, 1, 1, 1), (1, 1, 1, 6), (1, 1, 6, 1)]


def by_hand(pred, shape):
    """The mask as nested lists, one Python call of ``pred(b, h, i, j)`` per element."""
    B, H, Nq, Nk = shape
    return [[[[bool(pred(b, h, i, j)) for j in range(Nk)] for i in range(Nq)] for h in range(H)]
            for b in range(B)]


def check(fn, shape, pred):
    got = masks.materialize(fn, shape)
    assert got.dtype == torch.bool
    assert tuple(got.shape) == tuple(shape)
    assert got.is_contiguous()
    assert got.tolist() == by_hand(pred, shape)


@pytest.mark.parametrize("shape", SHAPES)
def test_full(shape):
    check(masks.full, shape, lambda b, h, i, j: True)


@pytest.mark.parametrize("shape", SHAPES)
def test_causal_top_left(shape):
    check(masks.causal_top_left, shape, lambda b, h, i, j: j <= i)


@pytest.mark.parametrize("shape", SHAPES)
def test_causal_bottom_right(shape):
    _, _, Nq, Nk = shape
    check(masks.causal_bottom_right(Nq, Nk), shape, lambda b, h, i, j: j <= i + Nk - Nq)


def test_causal_bottom_right_last_query_sees_every_key_and_early_rows_may_be_empty():
    got = masks.materialize(masks.causal_bottom_right(7, 4), (1, 1, 7, 4))
    assert got[0, 0, -1].all()
    # Nq > Nk: the first Nq - Nk queries have no visible key.
    assert got[0, 0, :3].sum() == 0 and got[0, 0, 3].sum() == 1


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["none", "top_left", "bottom_right", None, False])
def test_causal_by_name(shape, mode):
    _, _, Nq, Nk = shape
    rule = {
        "top_left": lambda b, h, i, j: j <= i,
        "bottom_right": lambda b, h, i, j: j <= i + Nk - Nq,
    }.get(mode, lambda b, h, i, j: True)
    check(masks.causal(mode, Nq, Nk), shape, rule)


@pytest.mark.parametrize("mode", [True, "causal", "bottom-right", 1])
def test_causal_bad_mode(mode):
    with pytest.raises(InvalidArgument, match=r"^mode=.*unknown causal alignment.*Use one of"):
        masks.causal(mode, 4, 4)


def test_causal_true_says_why_it_is_ambiguous():
    with pytest.raises(InvalidArgument, match="ambiguous"):
        masks.causal(True, 4, 4)


@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (3, 1, 4, 9), (2, 2, 7, 4)])
def test_key_padding_right(shape):
    B, _, _, Nk = shape
    lengths = [Nk, 0, Nk - 2][:B]
    check(masks.key_padding_right(lengths), shape, lambda b, h, i, j: j < lengths[b])


@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (3, 1, 4, 9), (2, 2, 7, 4)])
def test_key_padding_left(shape):
    B, _, _, Nk = shape
    lengths = [Nk, 0, Nk - 2][:B]
    check(masks.key_padding_left(lengths, Nk), shape, lambda b, h, i, j: j >= Nk - lengths[b])


def test_key_padding_accepts_a_tensor_and_lengths_past_nk():
    shape = (2, 1, 3, 4)
    check(masks.key_padding_right(torch.tensor([9, 1])), shape,
          lambda b, h, i, j: j < [9, 1][b])
    check(masks.key_padding_left(torch.tensor([9, 1]), 4), shape,
          lambda b, h, i, j: j >= 4 - [9, 1][b])


@pytest.mark.parametrize("factory", [masks.key_padding_right, lambda lens: masks.key_padding_left(lens, 4)])
@pytest.mark.parametrize("lengths", [[3, -1], [], torch.tensor([-2])])
def test_key_padding_bad_lengths(factory, lengths):
    with pytest.raises(InvalidArgument, match=r"^lengths=.*non-negative key count.*Pass a list"):
        factory(lengths)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("left,right,offset", [(0, 0, 0), (2, 0, 0), (1, 2, 0), (3, 1, -2), (0, 0, 5)])
def test_sliding_window(shape, left, right, offset):
    check(masks.sliding_window(left, right, offset=offset), shape,
          lambda b, h, i, j: i + offset - left <= j <= i + offset + right)


def test_sliding_window_bottom_right_causal_equals_causal_bottom_right_with_wide_window():
    Nq, Nk = 5, 9
    wide = masks.materialize(masks.sliding_window(Nk, 0, offset=Nk - Nq), (1, 1, Nq, Nk))
    assert torch.equal(wide, masks.materialize(masks.causal_bottom_right(Nq, Nk), (1, 1, Nq, Nk)))


@pytest.mark.parametrize("left,right,name", [(-1, 0, "left"), (2, -3, "right"), (-1, -1, "left")])
def test_sliding_window_bad_sides(left, right, name):
    bad = left if name == "left" else right
    with pytest.raises(InvalidArgument, match=rf"^{name}={bad}: window sides must be non-negative\. Pass"):
        masks.sliding_window(left, right)


@pytest.mark.parametrize("mshape", [(2, 3, 5, 7), (1, 1, 5, 7), (2, 1, 1, 7), (1, 3, 5, 1), (1, 1, 1, 1)])
def test_from_tensor(mshape):
    shape = (2, 3, 5, 7)
    g = torch.Generator().manual_seed(sum(mshape))
    m = torch.rand(mshape, generator=g) > 0.5
    pick = lambda idx, size: idx if size > 1 else 0  # noqa: E731
    check(masks.from_tensor(m), shape,
          lambda b, h, i, j: m[pick(b, mshape[0]), pick(h, mshape[1]), pick(i, mshape[2]), pick(j, mshape[3])])


@pytest.mark.parametrize("mshape", [(5, 7), (7,), (3, 5, 7), ()])
def test_from_tensor_accepts_fewer_dims_like_the_calling_convention(mshape):
    shape = (2, 3, 5, 7)
    m = torch.rand(mshape, generator=torch.Generator().manual_seed(1)) > 0.5
    assert torch.equal(masks.materialize(masks.from_tensor(m), shape), torch.broadcast_to(m, shape))


@pytest.mark.parametrize("bad", [torch.ones(1, 1, 2, 2), torch.ones(1, 1, 1, 2, 2, dtype=torch.bool),
                                 [[True]], None])
def test_from_tensor_bad_mask(bad):
    with pytest.raises(InvalidArgument, match=r"^mask=.*torch\.bool tensor.*Pass a boolean tensor"):
        masks.from_tensor(bad)


def _random_mask(shape, seed):
    m = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.5
    return masks.from_tensor(m), m


@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (1, 2, 7, 4), (2, 1, 4, 9)])
def test_and_or_masks(shape):
    _, _, Nq, Nk = shape
    fn, m = _random_mask(shape, 0)
    window = masks.sliding_window(1, 1)
    both = masks.and_masks(masks.causal_bottom_right(Nq, Nk), fn, window)
    either = masks.or_masks(masks.causal_top_left, fn, window)
    check(both, shape, lambda b, h, i, j: j <= i + Nk - Nq and bool(m[b, h, i, j]) and i - 1 <= j <= i + 1)
    check(either, shape, lambda b, h, i, j: j <= i or bool(m[b, h, i, j]) or i - 1 <= j <= i + 1)


def test_and_or_of_nothing_are_the_identities():
    shape = (1, 2, 3, 4)
    check(masks.and_masks(), shape, lambda b, h, i, j: True)
    check(masks.or_masks(), shape, lambda b, h, i, j: False)
    check(masks.and_masks(masks.causal_top_left), shape, lambda b, h, i, j: j <= i)
    check(masks.or_masks(masks.causal_top_left), shape, lambda b, h, i, j: j <= i)


def test_mask_functions_work_on_scalar_indices_like_flex_attention():
    # FlexAttention calls mask_mod with 0-d index tensors (under vmap); every function must accept them.
    m = torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(2)) > 0.5
    fns = [masks.full, masks.causal_top_left, masks.causal_bottom_right(5, 7), masks.key_padding_right([3, 6]),
           masks.key_padding_left([3, 6], 7), masks.sliding_window(1, 2), masks.from_tensor(m),
           masks.and_masks(masks.causal_top_left, masks.from_tensor(m)), masks.or_masks(masks.full)]
    full = [masks.materialize(fn, (2, 3, 5, 7)) for fn in fns]
    for b, h, i, j in itertools.product(range(2), range(3), range(5), range(7)):
        args = [torch.tensor(x) for x in (b, h, i, j)]
        for fn, dense in zip(fns, full):
            assert bool(fn(*args)) == bool(dense[b, h, i, j]), (fn.__name__, b, h, i, j)


def test_materialize_on_a_device_argument():
    got = masks.materialize(masks.causal_top_left, (1, 1, 3, 3), device=torch.device("cpu"))
    assert got.device.type == "cpu"


@pytest.mark.parametrize("shape", [(1, 2, 3), (1, 2, 3, 4, 5), (1, 0, 3, 3), (1, 1, -2, 3), ()])
def test_materialize_bad_shape(shape):
    with pytest.raises(InvalidArgument, match=r"^shape=.*four positive sizes.*Pass the full attention shape"):
        masks.materialize(masks.full, shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("mshape", [None, "full", (1, 1, "Nq", "Nk"), ("Nk",)])
def test_visible(shape, mode, mshape):
    B, H, Nq, Nk = shape
    if mshape is None:
        attn_mask = None
    else:
        sizes = shape if mshape == "full" else tuple({"Nq": Nq, "Nk": Nk}.get(s, s) for s in mshape)
        attn_mask = torch.rand(sizes, generator=torch.Generator().manual_seed(B + H + Nq + Nk)) > 0.4
    dense = None if attn_mask is None else torch.broadcast_to(attn_mask, shape)
    rule = {"none": lambda i, j: True, "top_left": lambda i, j: j <= i,
            "bottom_right": lambda i, j: j <= i + Nk - Nq}[mode]
    got = masks.visible(mode, attn_mask, shape)
    assert got.dtype == torch.bool and tuple(got.shape) == shape
    assert got.tolist() == by_hand(lambda b, h, i, j: rule(i, j) and (dense is None or bool(dense[b, h, i, j])),
                                   shape)


def test_visible_bad_arguments():
    with pytest.raises(InvalidArgument, match=r"^causal_mode=True: unknown causal alignment"):
        masks.visible(True, None, (1, 1, 2, 2))
    with pytest.raises(InvalidArgument, match=r"^shape=\(1, 2, 2\): expected four positive sizes"):
        masks.visible("none", None, (1, 2, 2))
    with pytest.raises(InvalidArgument, match=r"^attn_mask=.*does not broadcast to \(1, 1, 2, 2\)"):
        masks.visible("none", torch.ones(3, 2, dtype=torch.bool), (1, 1, 2, 2))
