"""The kit's third W4A16 kernel (scripts/patches/w4a16_il_kernel.py: weights repacked so a slice is a group) on CPU,
under Triton's interpreter, against the float64 dequant-matmul of the second kernel's module: decode shapes, group
sizes 32 and 128, a split of K (partials summed inside the kernel, split_k.py; each case called twice, so the counts a
split leaves behind are tested too), N past a block. The interpreter has no
bfloat16, so float16 and float32 here; `make gemm` checks bfloat16 on the GPU against the same reference."""
from __future__ import annotations

import pytest
from interp import PRELUDE, REPORT, run

CHECK = PRELUDE + r'''
from scripts.patches.w4a16_kernel import pack, reference
from scripts.patches.w4a16_il_kernel import pack_il, repack_il, unpack_il, w4a16_il_matmul
q = torch.randint(-8, 8, (n, k))
wp, wil = pack(q), pack_il(q)
assert torch.equal(repack_il(wp), wil) and torch.equal(unpack_il(wil), wp)
# The layout's definition: word 32b + c holds, at bits 4j.., the weight at k = 256b + 32j + c, stored + 8.
b, c, j = (k // 256) - 1, 5, 3
assert (((wil[:, 32 * b + c].to(torch.int64) & 0xFFFFFFFF) >> (4 * j)) & 0xF).sub(8).equal(q[:, 256 * b + 32 * j + c])
s = (torch.rand(n, k // g) * 0.1 + 0.01).to(dt)
x = torch.randn(m, k).to(dt)
y = w4a16_il_matmul(x, wil, s, g, config=config)
assert torch.equal(y, w4a16_il_matmul(x, wil, s, g, config=config)), "a second call gave other sums"
ref = reference(x, wp, s, g)
''' + REPORT


@pytest.mark.parametrize("m,n,k,g,dt,config,seed,tol", [
    (1, 16, 256, 32, "float32", None, 1, 1e-6),                                 # the default: one block, no split
    (5, 48, 768, 32, "float16", {"BLOCK_N": 32, "SPLIT_K": 2}, 2, 1e-3),       # MTP verify; 3 blocks over 2 splits
    (8, 40, 1024, 128, "float32", {"BLOCK_N": 16, "SPLIT_K": 4}, 3, 1e-6),     # group 128: 4 slices share a scale
    (3, 80, 512, 32, "float16", {"BLOCK_N": 64, "SPLIT_K": 1}, 4, 1e-3),       # N past a block, rows masked
])
def test_matches_the_float64_reference(m, n, k, g, dt, config, seed, tol):
    out = run(CHECK, [m, n, k, g, dt, config, seed])
    assert out["shape"] == [m, n] and out["dtype"] == f"torch.{dt}" and out["finite"]
    assert out["err"] < tol, out


def test_configs_are_distinct_and_split_as_the_shared_buffers_allow():
    from scripts.patches.split_k import MIN_BLOCK_N, SPLITS
    from scripts.patches.w4a16_il_kernel import CONFIGS
    keys = [(c.kwargs["BLOCK_N"], c.kwargs["SPLIT_K"], c.num_warps, c.num_stages) for c in CONFIGS]
    assert len(keys) == len(set(keys))
    assert all(c.kwargs["SPLIT_K"] in SPLITS and c.kwargs["BLOCK_N"] % MIN_BLOCK_N == 0 for c in CONFIGS)


def test_refuses_what_it_does_not_cover():
    torch = pytest.importorskip("torch")
    from scripts.patches.w4a16_il_kernel import pack_il, w4a16_il_matmul
    with pytest.raises(ValueError, match="M <= 16"):
        w4a16_il_matmul(torch.zeros(17, 256), torch.zeros(8, 32, dtype=torch.int32), torch.zeros(8, 8), 32)
    with pytest.raises(ValueError, match="multiple of 256"):  # K = 128: no whole block
        w4a16_il_matmul(torch.zeros(1, 128), torch.zeros(8, 16, dtype=torch.int32), torch.zeros(8, 4), 32)
    with pytest.raises(ValueError, match="shapes"):  # group 16 splits a slice
        w4a16_il_matmul(torch.zeros(1, 256), torch.zeros(8, 32, dtype=torch.int32), torch.zeros(8, 16), 16)
    with pytest.raises(ValueError, match="multiple of 256"):
        pack_il(torch.zeros(4, 128, dtype=torch.int64))
