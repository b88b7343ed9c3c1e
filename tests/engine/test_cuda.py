"""CUDA kernels and the CUDA engine against the CPU reference paths (skipped without a GPU)."""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_paged_attention_matches_gather():
    from laminar.cuda_check import check_paged_attention

    assert check_paged_attention(torch.float32) < 1e-5
    assert check_paged_attention(torch.bfloat16) < 2e-2


def test_rotation_and_cache_store_kernel_matches_the_two_steps_it_fuses():
    from laminar.cuda_check import check_rope_store

    assert check_rope_store(torch.float32) < 1e-5
    assert check_rope_store(torch.bfloat16) < 2e-2


def test_triton_sampler_matches_torch():
    from laminar.cuda_check import check_sampler

    same, gap = check_sampler()
    assert same >= 0.98 and gap < 1e-3


def test_cuda_engine_matches_cpu_engine():
    from laminar.cuda_check import check_engine_against_cpu

    res = check_engine_against_cpu()
    n, total = res["greedy"]["identical_requests"].split("/")
    assert n == total and res["export_import_identical"]


def test_pipelined_cuda_engine_matches_step_by_step():
    from laminar.cuda_check import check_pipeline

    n, total = check_pipeline()["greedy"].split("/")
    assert n == total


def test_gate_up_kernel_matches_the_product_and_silu_it_fuses():
    from laminar.cuda_check import check_gate_up

    assert check_gate_up(torch.float32) < 1e-5
    assert check_gate_up(torch.bfloat16) < 2e-2


def test_speculation_on_cuda_matches_off():
    from laminar.cuda_check import check_speculation

    res = check_speculation()
    for name in ("greedy", "sampled"):
        n, total = res[name]["identical_requests"].split("/")
        assert n == total and res[name]["verify_steps"] > 0, res
