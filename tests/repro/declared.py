"""The planted kernels under flashcheck's decorator, with a spec that declares a backward pass (a plain callable's
default spec has none): cases found on these name the functions underneath, which import no flashcheck."""

from planted_attention import fixed as _fixed
from planted_attention import wrong_dv as _wrong_dv

import flashcheck

wrong_dv = flashcheck.kernel(_wrong_dv, backward=True)
fixed = flashcheck.kernel(_fixed, backward=True)

from planted_sparse import sparse_fixed as _sparse_fixed
from planted_sparse import sparse_padding_as_key_0 as _sparse_padding_as_key_0

sparse_fixed = flashcheck.kernel(_sparse_fixed, key_sets=True, causal=("none", "bottom_right"))
sparse_padding_as_key_0 = flashcheck.kernel(_sparse_padding_as_key_0, key_sets=True, causal=("none", "bottom_right"))

from planted_block_sparse import blocks_fixed as _blocks_fixed
from planted_block_sparse import blocks_past_count as _blocks_past_count
from planted_block_sparse import twice_counted_once as _twice_counted_once
from planted_block_sparse import twice_fixed as _twice_fixed

_BLOCKS = flashcheck.BlockSparse(q_block=4, kv_block=4, full_blocks="trusted")
blocks_fixed = flashcheck.kernel(_blocks_fixed, block_sparse=_BLOCKS, causal=("none", "top_left"))
blocks_past_count = flashcheck.kernel(_blocks_past_count, block_sparse=_BLOCKS, causal=("none", "top_left"))
_TWICE = flashcheck.KeySets(duplicates="twice")
twice_fixed = flashcheck.kernel(_twice_fixed, key_sets=_TWICE, causal=("none", "bottom_right"))
twice_counted_once = flashcheck.kernel(_twice_counted_once, key_sets=_TWICE, causal=("none", "bottom_right"))

from planted_quantized import mx_e8m0_as_e4m3 as _mx_e8m0_as_e4m3
from planted_quantized import mx_fixed as _mx_fixed

mx_fixed = flashcheck.kernel(_mx_fixed, dtypes=("fp8_e4m3",), quantization="mxfp8")
mx_e8m0_as_e4m3 = flashcheck.kernel(_mx_e8m0_as_e4m3, dtypes=("fp8_e4m3",), quantization="mxfp8")

from planted_quantized import nvfp4_fixed as _nvfp4_fixed
from planted_quantized import nvfp4_k_global_forgotten as _nvfp4_k_global_forgotten

nvfp4_fixed = flashcheck.kernel(_nvfp4_fixed, dtypes=("fp8_e4m3",), quantization="nvfp4")
nvfp4_k_global_forgotten = flashcheck.kernel(_nvfp4_k_global_forgotten, dtypes=("fp8_e4m3",), quantization="nvfp4")
