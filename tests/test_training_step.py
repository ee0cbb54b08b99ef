"""A BAE training step for accelerators: it compiles as one graph (no host syncs, no graph
breaks), runs under autocast with the losses of fp32, and keeps its running statistics in fp32
whatever dtype its parameters are cast to."""

from __future__ import annotations

import pytest
import torch
from sae_lens.saes.sae import TrainStepInput

from sae_lens_bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.code_mean import update_running_mean
from sae_lens_bae.saes.objective import bae_objective
from sae_lens_bae.stacks.training import StackedBAE


def _bae(d_in: int = 16, seed: int = 0) -> BAETrainingSAE:
    torch.manual_seed(seed)
    return BAETrainingSAE(BAETrainingSAEConfig(d_in=d_in, d_sae=4 * d_in, entropy_off_steps=25))


def _step_input(sae: BAETrainingSAE, x: torch.Tensor, step: int) -> TrainStepInput:
    coefficients = {
        name: value if isinstance(value, float) else value.value
        for name, value in sae.get_coefficients().items()
    }
    return TrainStepInput(
        sae_in=x,
        coefficients=coefficients,
        dead_neuron_mask=None,
        n_training_steps=step,
        is_logging_step=False,
    )


def _loss_and_grads(sae: BAETrainingSAE, forward, x: torch.Tensor, step: int):
    sae.zero_grad(set_to_none=True)
    loss = forward(x, step)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in sae.named_parameters()}


def test_a_training_step_compiles_as_one_graph_with_the_eager_losses_and_gradients():
    """fullgraph=True fails on any graph break, which a host sync (``bool(tensor)``, ``.item()``)
    in the step would cause; the AOT backend also traces the backward (covariance included)."""
    sae = _bae()
    x = torch.randn(128, 16, generator=torch.Generator().manual_seed(1))

    def forward(x: torch.Tensor, step: int) -> torch.Tensor:
        return sae.training_forward_pass(_step_input(sae, x, step)).loss

    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
    for step in (10, 60):  # entropy off (first quarter), then on
        eager_loss, eager_grads = _loss_and_grads(sae, forward, x, step)
        loss, grads = _loss_and_grads(sae, compiled, x, step)
        assert torch.equal(loss, eager_loss)
        assert grads.keys() == eager_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, eager_grads[name], rtol=0, atol=0, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a CUDA matter: no GPU")
def test_a_cuda_training_step_never_waits_for_the_host():
    """Forward, backward (the fused covariance kernels on a GPU with triton) and Adam's update
    under ``set_sync_debug_mode("error")``, which raises on any call that blocks the host on the
    device (``.item()``, ``bool(tensor)``, a pageable copy to the host, ``nonzero``). One step
    first: per-shape set-up (the tile list copied to the device, kernel compilation) is not a
    step's cost."""
    sae = _bae(d_in=64).cuda()
    optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
    x = torch.randn(256, 64, device="cuda")
    for step, check in ((59, False), (60, True), (61, True)):
        torch.cuda.set_sync_debug_mode("error" if check else "default")
        try:
            optimizer.zero_grad(set_to_none=True)
            sae.training_forward_pass(_step_input(sae, x, step)).loss.backward()
            optimizer.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert float(sae.code_mean_count) == 3.0  # every step updated the running mean


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inductor's CUDA graphs need a GPU")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_cuda_step_compiled_by_inductor_gives_the_eager_losses_and_gradients(mode):
    """What ``bae train --compile`` (and ``--compile-mode reduce-overhead``: a CUDA graph) runs on
    a GPU: inductor's step, the penalty's Triton kernels inside it as one op, against the eager
    step (the kernels through their autograd Function) on the same weights."""
    sae = _bae(d_in=64).cuda()
    x = torch.randn(256, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(3))

    def forward(x: torch.Tensor, step: int) -> torch.Tensor:
        return sae.training_forward_pass(_step_input(sae, x, step)).loss

    compiled = torch.compile(forward, mode=mode)
    for step in (60, 61, 62):  # CUDA graphs record on the first calls, then replay
        eager_loss, eager_grads = _loss_and_grads(sae, forward, x, step)
        loss, grads = _loss_and_grads(sae, compiled, x, step)
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=0)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    torch._dynamo.reset()


def test_a_compiled_step_still_refuses_nan_activations():
    """Under compile the input check runs on the device (no sync) and still fails the step."""
    sae = _bae()
    x = torch.randn(64, 16)
    x[5, 3] = float("nan")
    compiled = torch.compile(
        lambda x: sae.training_forward_pass(_step_input(sae, x, 60)).loss,
        fullgraph=True,
        backend="aot_eager",
    )
    with pytest.raises(RuntimeError, match="NaN/Inf activations"):
        compiled(x)


def test_training_under_bf16_autocast_gives_the_fp32_losses():
    sae = _bae(d_in=64)
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(2))
    fp32 = sae.training_forward_pass(_step_input(sae, x, 60)).losses
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = sae.training_forward_pass(_step_input(sae, x, 60)).losses
    for name, value in fp32.items():
        assert mixed[name].dtype == torch.float32, name
        torch.testing.assert_close(mixed[name], value, rtol=1e-3, atol=0, msg=name)


def test_the_objective_of_bf16_outputs_is_computed_in_fp32():
    """Under autocast a decoder can hand over bf16 outputs; the reconstruction term must not be
    rounded to bf16's 3 significant digits."""
    generator = torch.Generator().manual_seed(3)
    sae_in = torch.randn(256, 32, generator=generator)
    sae_out = (sae_in + 0.1 * torch.randn(256, 32, generator=generator)).bfloat16()
    bits = (torch.rand(256, 48, generator=generator) < 0.3).float()
    kwargs = {
        "entropy_coefficient": 1e-3,
        "covariance_coefficient": 1e-3,
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = bae_objective(sae_in, sae_out, bits, **kwargs)
    exact = bae_objective(sae_in, sae_out.float(), bits, **kwargs)
    for name, value in exact.items():
        assert mixed[name].dtype == torch.float32, name
        assert torch.equal(mixed[name], value), name


def test_running_statistics_stay_fp32_in_a_bf16_bae():
    """In bf16 the update count stalls at 256 (256 + 1 rounds to 256): the running mean would
    weigh every later batch 1/256 instead of 1/count."""
    sae, reference = _bae(), _bae()
    sae.to(torch.bfloat16)
    assert sae.W_enc.dtype == torch.bfloat16
    assert sae.code_mean.dtype == sae.code_mean_count.dtype == torch.float32
    generator = torch.Generator().manual_seed(4)
    for _ in range(300):
        batch_mean = torch.rand(sae.cfg.d_sae, generator=generator)
        update_running_mean(sae.code_mean, sae.code_mean_count, batch_mean, 0.999)
        update_running_mean(reference.code_mean, reference.code_mean_count, batch_mean, 0.999)
    assert sae.code_mean_count.item() == 300
    assert torch.equal(sae.code_mean, reference.code_mean)


def test_casting_a_trained_bae_or_stack_to_bf16_leaves_its_running_statistics_untouched():
    """The cast itself must not round them either: 1001 updates is not a bf16 number, nor are
    most running means."""
    sae = _bae()
    stack = StackedBAE(sae.cfg, seeds=[0, 1])
    generator = torch.Generator().manual_seed(5)
    for _ in range(1001):
        batch_mean = torch.rand(sae.cfg.d_sae, generator=generator)
        update_running_mean(sae.code_mean, sae.code_mean_count, batch_mean, 0.999)
        update_running_mean(stack.code_mean, stack.code_mean_count, batch_mean.expand(2, -1), 0.999)
    for model in (sae, stack):
        mean, count = model.code_mean.clone(), model.code_mean_count.clone()
        model.to(torch.bfloat16)
        assert model.W_enc.dtype == torch.bfloat16
        assert torch.equal(model.code_mean, mean) and torch.equal(model.code_mean_count, count)
        assert model.code_mean_count.item() == 1001
