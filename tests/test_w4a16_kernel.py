"""The kit's Triton W4A16 kernel (scripts/patches/w4a16_kernel.py) on CPU, under Triton's interpreter, against a
float64 dequant-matmul: decode shapes (M 1..8, 1+K = 5), group sizes 32 and 128, block sizes from the autotuner's
list, K and N past a whole block. Fresh random inputs each case.
The interpreter has no bfloat16 (its results are garbage there), so float16 and float32 are checked here and
bfloat16 on the GPU, where `make gemm` checks every shape against the same reference before timing it."""
from __future__ import annotations

import pytest
from interp import PRELUDE, REPORT, run

CHECK = PRELUDE + r'''
from scripts.patches.w4a16_kernel import w4a16_matmul, reference, pack
q = torch.randint(-8, 8, (n, k))
wp = pack(q)
# The packer is the layout's definition: value j of word c is the weight at k = 8c + j, stored + 8.
assert torch.equal(((wp.to(torch.int64) & 0xFFFFFFFF) >> 4 * 3 & 0xF)[:, 1] - 8, q[:, 8 + 3])
s = (torch.rand(n, k // g) * 0.1 + 0.01).to(dt)
x = torch.randn(m, k).to(dt)
y = w4a16_matmul(x, wp, s, g, config=config)
ref = reference(x, wp, s, g)
''' + REPORT


@pytest.mark.parametrize("m,n,k,g,dt,config,seed,tol", [
    (1, 16, 512, 32, "float32", None, 1, 1e-6),                                # the interpreter's default blocks
    (5, 96, 256, 32, "float16", {"BLOCK_N": 32, "BLOCK_K": 256}, 2, 1e-3),    # MTP K=4 verify, rows 5..15 masked
    (8, 48, 1024, 128, "float32", {"BLOCK_N": 16, "BLOCK_K": 512}, 3, 1e-6),  # group 128: 4 groups a step
    (3, 80, 384, 32, "float16", {"BLOCK_N": 64, "BLOCK_K": 256}, 4, 1e-3),    # K past the last step, N past a block
])
def test_matches_the_float64_reference(m, n, k, g, dt, config, seed, tol):
    out = run(CHECK, [m, n, k, g, dt, config, seed])
    assert out["shape"] == [m, n] and out["dtype"] == f"torch.{dt}" and out["finite"]
    assert out["err"] < tol, out


def test_every_autotuned_config_can_run_the_kernel():
    """tl.dot takes no K tile under 16 (BLOCK_K // 8 words); a config outside the launch's reach is dead weight."""
    from scripts.patches.w4a16_kernel import CONFIGS
    assert len(CONFIGS) == len({(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages) for c in CONFIGS})
    for c in CONFIGS:
        assert c.kwargs["BLOCK_K"] // 8 >= 16 and c.kwargs["BLOCK_N"] >= 16, c
    # N = 2560 (Qwen's hidden size: down_proj, o_proj, out_proj) must fill an H100's 132 SMs with some config.
    assert max(-(-2560 // c.kwargs["BLOCK_N"]) for c in CONFIGS) >= 132


def test_refuses_what_it_does_not_cover():
    torch = pytest.importorskip("torch")
    from scripts.patches.w4a16_kernel import w4a16_matmul
    x = torch.zeros(17, 256)
    with pytest.raises(ValueError, match="M <= 16"):
        w4a16_matmul(x, torch.zeros(8, 32, dtype=torch.int32), torch.zeros(8, 8), 32)
    with pytest.raises(ValueError, match="shapes"):
        w4a16_matmul(torch.zeros(1, 256), torch.zeros(8, 16, dtype=torch.int32), torch.zeros(8, 8), 32)
    with pytest.raises(ValueError, match="shapes"):  # a group that splits a word
        w4a16_matmul(torch.zeros(1, 256), torch.zeros(8, 32, dtype=torch.int32), torch.zeros(8, 64), 4)
