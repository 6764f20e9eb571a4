"""A serving case's part of a reproducer (see :mod:`flashcheck.repro.script`): the packed (varlen) or paged
tensors and the form's keywords as the kernel got them, its call at each split count of a split-KV kernel, and the
exact answer of each sequence from the float64 attention of :mod:`flashcheck.repro._script`, placed in the form's
output layout. What comes after the line ``# ---- form ----`` is copied into the script in place of the template's
``@FORM@`` line."""

import math

import torch

from ._script import CASE, SCALE_KEYWORDS, attention64, inputs, judge_output, scale, tensor

# ---- form ----


def serving_inputs(device):
    """The packed or paged q, k, v as the kernel received them, the form's keywords (x["form"]), and the variant's
    keyword arguments."""
    x, kw = inputs(device)
    x["form"] = {n: tensor(v, device) if isinstance(v, dict) else v for n, v in CASE["form"]["keywords"].items()}
    return x, kw


def serving_run(fn, x, kw, device):
    """(split count, the kernel's result) at each split count of a split-KV kernel; one call (None) otherwise."""
    results = []
    for n in CASE["form"]["num_splits"] or [None]:
        splits = {} if n is None else {"num_splits": n}
        results.append((n, fn(x["q"], x["k"], x["v"], **x["form"], scale=scale(), causal=CASE["causal"], **kw,
                              **splits)))
    return results


def serving_judge(results, x, kw, device):
    expected = serving_expected(x, kw, device)
    count = 0
    for n, result in results:
        if n is not None:
            print(f"num_splits={n}:")
        count += judge_output(result, *expected, device)
    return count


def sequences(x):
    """(b, its rows of the output, q (Nq, Hq, D), k and v (Nk, Hkv, D)) of each sequence, read from the packed
    tensors through cu_seqlens (and seqused_k), or from the page pool through the block table."""
    form = x["form"]
    if CASE["form"]["form"] == "varlen":
        cu_q, cu_k = form["cu_seqlens_q"].tolist(), form["cu_seqlens_k"].tolist()
        used = form["seqused_k"].tolist() if "seqused_k" in form else None
        for b in range(len(cu_q) - 1):
            keys = slice(cu_k[b], (cu_k[b] + used[b]) if used is not None else cu_k[b + 1])
            yield b, slice(cu_q[b], cu_q[b + 1]), x["q"][cu_q[b]:cu_q[b + 1]], x["k"][keys], x["v"][keys]
        return
    page = x["k"].shape[1]
    for b, n in enumerate(form["cache_seqlens"].tolist()):
        j = torch.arange(n, device=x["k"].device)
        pages = form["block_table"][b].long()[j // page]
        yield b, b, x["q"][b], x["k"][pages, j % page], x["v"][pages, j % page]


def sequence_kw(kw, b):
    """The variant's keywords of sequence b: those given per sequence (CASE["per_sequence"]: keyword -> its batch
    dim) and the quantized inputs' scales (SCALE_KEYWORDS, (B, Hkv)) cut to it."""
    dims = {**CASE["per_sequence"], **{n: 0 for n in SCALE_KEYWORDS.values() if n in kw}}
    return {n: v.narrow(dims[n], b, 1) if n in dims else v for n, v in kw.items()}


def serving_expected(x, kw, device):
    """The exact out and lse in the form's layout, each with its rows that see no key (a sequence without keys:
    all of them)."""
    out = torch.zeros(CASE["shapes"]["out"], dtype=torch.float64, device=device)
    lse = torch.full(CASE["shapes"]["lse"], -math.inf, dtype=torch.float64, device=device)
    out_empty = torch.zeros(out.shape[:-1], dtype=torch.bool, device=device)
    lse_empty = torch.zeros(lse.shape, dtype=torch.bool, device=device)
    for b, rows, q, k, v in sequences(x):
        if not q.shape[0]:
            continue
        if k.shape[0]:
            o, m, e = (t[0] for t in attention64(*(t.transpose(0, 1)[None] for t in (q, k, v)), None,
                                                 sequence_kw(kw, b)))
        else:
            o = torch.zeros(q.shape[1], q.shape[0], v.shape[2], dtype=torch.float64, device=device)
            m = torch.full(o.shape[:2], -math.inf, dtype=torch.float64, device=device)
            e = torch.ones(o.shape[:2], dtype=torch.bool, device=device)
        out[rows], out_empty[rows] = o.transpose(0, 1), e.transpose(0, 1)
        if CASE["form"]["form"] == "varlen":
            lse[:, rows], lse_empty[:, rows] = m, e
        else:
            lse[b], lse_empty[b] = m, e
    return (out, out_empty), (lse, lse_empty)


INPUTS, RUN, JUDGE = serving_inputs, serving_run, serving_judge
