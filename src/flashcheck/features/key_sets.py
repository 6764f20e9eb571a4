"""Sparse index sets: ``indices``, int32 (B, Hkv or 1, Nq, topk), the keys each query attends, -1 as padding (spec
``key_sets``, read by the convention of :mod:`flashcheck.contract.key_sets`). It only restricts the keys a query
sees: the oracle reads the set from the convention (:func:`key_counts`), never from a kernel's logic, and the
kernel is judged on the set it was given, whoever chose it.

On a serving form (varlen, paged, MLA's paged decode) an entry is a position in its query's own sequence, 0 to that
sequence's key count - 1 (:mod:`flashcheck.contract.key_sets`): each sequence's logical case keeps its queries' lists
(``per_query``), the kernel receives them laid out as q, and lists drawn over the padded case are moved into each
sequence's keys (:func:`into_sequences`).

Its regimes are drawn from where reported bugs cluster: padding (-1 read as key 0), padding before valid entries,
duplicates, indices at the last key and past it, unsorted and sorted lists, top-k longer than the keys, one key
chosen by every query, sets in the last partial tile, rows whose set is empty, and sets whose end splits keys
nearly tied (a kernel that re-derives the set from its scores picks the other)."""

from __future__ import annotations

import functools
import math

import torch

from ..contract.formats import is_quantized
from ..errors import InvalidArgument
from .base import Feature
from .draws import pick, upto
from .tensors import as_tensor

__all__ = ["FEATURE", "into_sequences", "key_counts", "key_set_mask", "key_set_weights", "PAST_END_REGIMES",
           "PADDING_FIRST_REGIMES"]

PAST_END_REGIMES = ("past_end",)  # regimes with indices >= Nk: drawn only where the spec masks them
PADDING_FIRST_REGIMES = ("padding_first",)  # -1 before valid entries: drawn only where the spec allows it
FITTED_REGIMES = ("near_ties",)  # placed at ties of the values (Feature.fitted): drawn in a float dtype
MAX_TOPK = 1 << 14  # a key's count fits int16 (key_counts) whatever repeats a list holds


def _check(indices):
    if indices is None:
        return None
    fix = "Pass indices as an int32 tensor (B, Hkv or 1, Nq, topk) of key positions, -1 as padding."
    t = as_tensor("indices", indices, fix)
    if t.dim() != 4 or t.numel() == 0 or t.is_floating_point() or t.dtype == torch.bool:
        raise InvalidArgument("indices", tuple(t.shape), "expected a non-empty integer tensor of 4 dims", fix)
    if t.shape[-1] > MAX_TOPK:
        raise InvalidArgument("indices", tuple(t.shape), f"top-k {t.shape[-1]} is above {MAX_TOPK}", fix)
    if bool((t < -1).any()) or bool((t > torch.iinfo(torch.int32).max).any()):
        raise InvalidArgument("indices", int(t.min()), "holds a value below -1 or past int32", fix)
    return t.detach().to("cpu", torch.int32).clone()


def _shape_problem(indices, shapes):
    b, h, n, _ = indices.shape
    if b != shapes.batch or h not in (1, shapes.heads_kv) or n != shapes.n_q:
        return (tuple(indices.shape), f"expected ({shapes.batch}, {shapes.heads_kv} or 1, {shapes.n_q}, topk)",
                "Pass one list of keys per batch entry, K/V head (or one for all) and query.")
    return None


def _refusal(variant, spec, dtype):
    convention = spec.key_sets
    if variant.duplicates != convention.duplicates:
        return (f"indices whose repeated keys count {variant.duplicates} (the kernel's spec declares "
                f"duplicates={convention.duplicates!r})")
    if variant.duplicates == "twice" and variant.capped and variant.bias_order == "bias_first":
        return "a key counted twice under a cap the bias goes into (bias_order='bias_first'): its weight is no logit"
    if convention.padding == "last" and _padding_first(variant.indices):
        return "indices with -1 before a valid entry (the kernel's spec declares padding='last')"
    return None


def _padding_first(indices: torch.Tensor) -> bool:
    padding = indices == -1
    return bool((padding[..., :-1] & ~padding[..., 1:]).any())


def key_counts(indices: torch.Tensor, n_k: int) -> torch.Tensor:
    """How often each key is listed, (B, Hs, Nq, Nk) int16: -1 and indices >= ``n_k`` count for nothing."""
    valid = (indices >= 0) & (indices < n_k)
    counts = torch.zeros((*indices.shape[:-1], n_k), dtype=torch.int16, device=indices.device)
    return counts.scatter_add_(-1, indices.clamp(0, max(n_k - 1, 0)).long(), valid.to(torch.int16))


def into_sequences(indices: torch.Tensor, n_k: int, k_lens) -> torch.Tensor:
    """Lists drawn over a serving case's ``n_k`` padded keys as positions in each sequence's own ``k_lens[b]`` keys:
    key j < ``n_k`` moves to j * k_len // ``n_k`` (key 0 and the last key stay the first and the last), an index past
    the padded keys moves as far past the sequence's end (``n_k`` to k_len), -1 stays; a sequence without keys lists
    none (so that a convention without indices past the keys holds none)."""
    lens = torch.tensor(list(k_lens), dtype=torch.int64).view(-1, 1, 1, 1)
    idx = indices.long()
    moved = torch.where(idx < n_k, idx * lens // max(n_k, 1), idx - n_k + lens)
    return torch.where((idx < 0) | (lens == 0), -1, moved).to(torch.int32)


@functools.lru_cache(maxsize=8)
def _visible_table(indices: torch.Tensor, n_k: int, device: str) -> torch.Tensor:
    # one table per variant, length and device: every block of the oracle's walk reads it
    return key_counts(indices.to(device), n_k) > 0


def _weights(variant, n_q: int, n_k: int, rows: torch.Tensor, device, size: bool):
    """The log of how often each key of ``rows`` is listed (B, 1, R, Nk) float64, 0 where it is not: a key counted
    twice weighs e^log 2 = 2. With ``size``, its magnitude (a legal kernel's sums hold the repeats, not this bias)."""
    counts = key_counts(variant.indices.to(device), n_k).index_select(2, rows.to(device)).to(torch.float64)
    return torch.log(counts.clamp(min=1.0))


def _weight_extent(variant, n_q: int, n_k: int) -> float:
    """Twice the largest log count: the log's own rounding in float64 included."""
    return 2 * math.log(max(1, variant.indices.shape[-1]))


def key_set_mask(indices: torch.Tensor, n_k: int, heads_q: int):
    """The index sets' mask_mod: key ``kv_idx`` is visible to query ``q_idx`` of query head ``h`` when its K/V
    head's list (or the one list) names it. Torch only: a reproducer script copies it."""
    group = max(1, heads_q // indices.shape[1])

    def key_set_mod(b, h, q_idx, kv_idx):
        table = _visible_table(indices, n_k, str(q_idx.device) if torch.is_tensor(q_idx) else "cpu")
        b = b if table.shape[0] > 1 else 0
        h = h // group if table.shape[1] > 1 else 0
        return table[b, h, q_idx, kv_idx]

    return key_set_mod


def key_set_script(indices, offset, device):
    """The index sets' mask_mod in a reproducer script, whose exact answer asks it once for every query and key at
    once (b, h broadcastable to (B, Hq, 1, 1), q_idx and kv_idx every query's and key's position): key j is visible to
    query i when i's list names j (-1 and positions past the keys name nothing). Torch only: a script copies it."""
    indices = indices.to(device).long()

    def key_set_mod(b, h, q_idx, kv_idx):
        n_k = kv_idx.shape[-1]
        valid = (indices >= 0) & (indices < n_k)
        counts = torch.zeros((*indices.shape[:-1], n_k), dtype=torch.int32, device=device)
        listed = counts.scatter_add_(-1, indices.clamp(0, n_k - 1), valid.to(torch.int32)) > 0
        return listed.repeat_interleave(h.shape[1] // listed.shape[1], 1) if listed.shape[1] > 1 else listed

    return key_set_mod


def key_set_weights(indices, n_k, device, settings):
    """How often each key counts in a reproducer script's exact answer, float64 (B, 1, Nq, Nk): under
    duplicates='twice' as often as listed (its exp multiplied by that), else None (once). Torch only: a script
    copies it."""
    if settings["duplicates"] != "twice":
        return None
    indices = indices.to(device).long()
    valid = (indices >= 0) & (indices < n_k)
    counts = torch.zeros((*indices.shape[:-1], n_k), dtype=torch.float64, device=device)
    return counts.scatter_add_(-1, indices.clamp(0, n_k - 1), valid.to(torch.float64))


def _reordered(indices, spec):
    """Each row's list in another order, drawn from a seed of the lists themselves (a replay permutes alike)."""
    if indices.shape[-1] < 2:
        return None
    gen = torch.Generator().manual_seed(int(indices.long().sum()) % (1 << 31))
    order = torch.rand(indices.shape, generator=gen).argsort(-1)
    return ("each row's index list permuted", indices.gather(-1, order).contiguous(),
            bool(spec.key_sets and spec.key_sets.order_invariant))


def _edge(indices, i: int, j: int, n_q: int, n_k: int, inside: bool) -> str:
    if inside and j == 0 and bool((indices == -1).any()):
        return " (key 0, which a -1 padding entry reads as)"
    if not inside and j == n_k - 1:
        return " (the last key, where indices past the keys clamp)"
    return ""


def _distinct(gen, s, topk: int, heads: int) -> torch.Tensor:
    """``topk`` distinct keys per row, unsorted (topk <= Nk)."""
    rows = s.batch * heads * s.n_q
    keys = torch.rand((rows, s.n_k), generator=gen).argsort(-1)[:, :topk]
    return keys.view(s.batch, heads, s.n_q, topk)


def _heads(gen, s) -> int:
    return pick(gen, (1, s.heads_kv))


def _regime(draw):
    """A regime of (gen, shapes, heads) as a feature's regime of (gen, shapes, one_list), int32: one list for every
    K/V head where ``one_list`` (the convention that counts repeats weighs one list)."""
    def drawn(gen, s, one_list=False):
        out = draw(gen, s, 1 if one_list else _heads(gen, s))
        return out[..., :MAX_TOPK].to(torch.int32).contiguous()  # long rows' lists stop at MAX_TOPK entries

    return drawn


def _sample(gen, s, h):
    return _distinct(gen, s, 1 + upto(gen, s.n_k - 1), h)


def _padded(gen, s, h, *, first: bool = False):
    """Distinct keys then -1 padding, a random count of valid entries per row (some rows none)."""
    topk = 1 + upto(gen, s.n_k)
    keys = _distinct(gen, s, min(topk, s.n_k), h)
    keys = torch.cat([keys, keys.new_full((*keys.shape[:-1], topk - keys.shape[-1]), -1)], -1)
    valid = torch.randint(0, topk + 1, (*keys.shape[:-1], 1), generator=gen)
    keys = torch.where(torch.arange(topk) < valid, keys, -1)
    if first:
        keys = keys.gather(-1, torch.rand(keys.shape, generator=gen).argsort(-1))
    return keys


def _duplicates(gen, s, h):
    """Keys drawn with replacement from a few, so most rows list some key more than once."""
    topk = 2 + upto(gen, 2 * s.n_k)
    few = max(1, s.n_k // 4)
    return torch.randint(0, few, (s.batch, h, s.n_q, topk), generator=gen) * max(1, s.n_k // few)


def _last_keys(gen, s, h):
    """Sets from the last keys, the last one always: the tail tile."""
    tail = min(s.n_k, 1 + upto(gen, 17))
    start = s.n_k - tail
    keys = start + torch.rand((s.batch, h, s.n_q, tail), generator=gen).argsort(-1)
    return torch.cat([keys.new_full((*keys.shape[:-1], 1), s.n_k - 1), keys], -1)


def _past_end(gen, s, h):
    """Valid keys mixed with indices at Nk, Nk + 1 and int32's largest: padding by the 'masked' convention."""
    keys = _sample(gen, s, h)
    past = torch.tensor([s.n_k, s.n_k + 1, torch.iinfo(torch.int32).max])
    extra = past[torch.randint(0, 3, (*keys.shape[:-1], 1 + upto(gen, 3)), generator=gen)]
    both = torch.cat([keys, extra], -1)
    return both.gather(-1, torch.rand(both.shape, generator=gen).argsort(-1))


def _over_keys(gen, s, h):
    """topk longer than the keys: every key once, then -1 (and a few repeats) up to topk."""
    every = _distinct(gen, s, s.n_k, h)
    more = 1 + upto(gen, s.n_k)
    fill = torch.where(torch.rand((*every.shape[:-1], more), generator=gen) < 0.8, -1,
                       torch.randint(0, s.n_k, (*every.shape[:-1], more), generator=gen))
    return torch.cat([every, fill], -1)


# k's bits as integers: one less is one ulp nearer zero, whatever the sign
_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64}


def _near_ties(gen, s, h):
    """A top-k below the keys' count, as distinct keys: :func:`_fit_near_ties` places it at a tie of the values (the
    drawn keys seed its choice between tied keys)."""
    return _distinct(gen, s, min(1 + upto(gen, s.n_k - 2), MAX_TOPK - 1), h)


def _twinned(k: torch.Tensor, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, each key's pair): every odd key a twin of the even key before it (an odd count's last key joins the last
    pair), bit for bit or one ulp nearer zero in its element of least nonzero magnitude, at random."""
    n_k = k.shape[-2]
    pair = torch.arange(n_k).div(2, rounding_mode="floor").clamp(max=n_k // 2 - 1).to(k.device)
    first = k.index_select(-2, 2 * pair)
    least = torch.where(first != 0, first.abs(), math.inf).argmin(-1, keepdim=True)
    # On the CPU, where the generator is, also inside a GPU campaign's drawing (a device context for factories).
    nudged = torch.rand((k.shape[0], 1, n_k), generator=gen, device="cpu").to(k.device) < 0.5  # alike on every head
    step = torch.zeros_like(first, dtype=_BITS[k.dtype]).scatter_(-1, least, 1) * nudged[..., None]
    step = step * (first.gather(-1, least) != 0)  # a key of zeros is copied
    twin = (torch.arange(n_k, device=k.device) != 2 * pair)[:, None]
    return torch.where(twin, (first.view(_BITS[k.dtype]) - step).view(k.dtype), k), pair


def _fit_near_ties(indices, q, k, scale: float):
    """The lists of :func:`_near_ties` rebuilt at ties: k's keys twinned (:func:`_twinned`), each row lists its
    query's best keys by the exact logits scale q.k in float64, up to the first pair split by the list's end at or
    after the drawn top-k. Of that pair it lists the lower logit, or either at random when they tie exactly: a
    kernel that takes the top-k of its own scores picks the other. A list for several heads is chosen on the first
    query head of its first K/V head (the others list a twin each, not always at their boundary)."""
    if k.dtype not in _BITS:  # drawn only in these (the regime's settings); a hand-built recipe can ask for more
        raise InvalidArgument("dtype", str(k.dtype).replace("torch.", ""), "the near_ties regime twins keys bit for "
                              "bit in fp16, bf16 or fp32; a quantized dtype would move the ties",
                              "Draw near_ties in fp16, bf16 or fp32, or another index regime in this dtype.")
    if k.shape[-2] < 2:
        return indices, k
    gen = torch.Generator().manual_seed(int(indices.long().sum()) % (1 << 31))
    k, pair = _twinned(k, gen)
    heads = torch.arange(indices.shape[1], device=k.device)
    scores = q[:, heads * (q.shape[1] // k.shape[1])].double() @ k[:, heads].double().transpose(-1, -2) * scale
    return _split_at_a_tie(scores, pair, indices.shape[-1], gen).to(indices.device, torch.int32).contiguous(), k


def _split_at_a_tie(scores, pair, topk: int, gen) -> torch.Tensor:
    """Each row's keys by ``scores`` down to the first pair split at or after rank ``topk``, the lower of that pair
    (either on an exact tie) last, then -1."""
    n_k = scores.shape[-1]
    ranks = scores.argsort(dim=-1, descending=True, stable=True)
    split = pair[ranks[..., :-1]] == pair[ranks[..., 1:]]
    split &= torch.arange(n_k - 1, device=scores.device) >= topk - 1
    end = torch.where(split.any(-1), split.int().argmax(-1), topk - 1)[..., None]  # the last entry's rank
    upper, lower = ranks.gather(-1, end), ranks.gather(-1, (end + 1).clamp(max=n_k - 1))
    coin = torch.rand(upper.shape, generator=gen, device="cpu").to(scores.device) < 0.5
    tied = scores.gather(-1, upper) == scores.gather(-1, lower)
    last = torch.where(split.any(-1, keepdim=True) & (~tied | coin), lower, upper)
    width = int(end.max()) + 1
    listed = ranks[..., :width].scatter(-1, end, last)
    return torch.where(torch.arange(width, device=scores.device) <= end, listed, -1)


def _one_key(gen, s, h):
    """Every query of every head lists the same one key, then padding."""
    key = upto(gen, s.n_k - 1)
    topk = 1 + upto(gen, 3)
    out = torch.full((s.batch, h, s.n_q, topk), -1)
    out[..., 0] = key
    return out


FEATURE = Feature(
    name="indices", flag="key_sets", term="keys", title="sparse index sets",
    summary="a list of keys per query (top-k), -1 as padding",
    check=_check, text=lambda value: f"topk={value.shape[-1]}", tensor=True, saved_dtype="int32",
    dims=lambda value: (-4, -3), kv_heads=True, per_head=True, per_query=True,
    into_sequences=into_sequences,
    shape_problem=_shape_problem, refusal=_refusal, required=lambda spec: bool(spec.key_sets and spec.key_sets.required),
    regimes={
        "none": None,
        "sampled": _regime(_sample),
        "sorted": _regime(lambda gen, s, h: _sample(gen, s, h).sort(-1).values),
        "padded": _regime(_padded),
        "padding_first": _regime(lambda gen, s, h: _padded(gen, s, h, first=True)),
        "duplicates": _regime(_duplicates),
        "last_keys": _regime(_last_keys),
        "past_end": _regime(_past_end),
        "over_keys": _regime(_over_keys),
        "one_key": _regime(_one_key),
        "all_padding": _regime(lambda gen, s, h: torch.full((s.batch, h, s.n_q, 1 + upto(gen, 4)), -1)),
        "near_ties": _regime(_near_ties),
    },
    fitted={"near_ties": _fit_near_ties},
    settings=lambda spec, dtype, regime, choose: (
        None if (regime in PAST_END_REGIMES and spec.key_sets.past_end == "never")
        or (regime in PADDING_FIRST_REGIMES and spec.key_sets.padding == "last")
        or (regime in FITTED_REGIMES and is_quantized(dtype))  # a quantization would move the ties
        else {"duplicates": spec.key_sets.duplicates}),
    draw=lambda name, regime, gen, shapes, settings: regime(gen, shapes, settings.get("duplicates") == "twice"),
    script={"mask_mod": key_set_script, "weight": key_set_weights},
    bias=_weights, bias_extent=_weight_extent, weighs=lambda variant: variant.duplicates == "twice",
    summed=lambda variant, n_k: variant.indices.shape[-1],
    visible=lambda value, n_q, n_k, heads_q: key_set_mask(value, n_k, heads_q),
    edge=_edge, reordered=_reordered,
)
